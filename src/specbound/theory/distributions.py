"""Distances and moments of next-token distributions (NumPy only, natural logs).

Naming follows docs/design.md (naming): ``target`` is the large model, ``draft`` the small one.
All functions work over the last axis and broadcast over the leading ones.
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecboundError

__all__ = [
    "as_distribution",
    "tv",
    "overlap",
    "residual",
    "entropy",
    "surprisal_moments",
]


def as_distribution(probs, name: str = "probs", atol: float = 1e-8) -> np.ndarray:
    """Return ``probs`` as float64 after checking it is a probability vector on the last axis."""
    arr = np.asarray(probs, dtype=np.float64)
    if arr.ndim == 0:
        raise SpecboundError(f"{name} must be an array of probabilities, got a scalar")
    if not np.all(np.isfinite(arr)):
        raise SpecboundError(f"{name} contains NaN or inf")
    if np.any(arr < -atol):
        raise SpecboundError(f"{name} has negative entries (min {arr.min():.3g})")
    sums = arr.sum(axis=-1)
    bad = np.abs(sums - 1.0) > max(atol, 1e-12 * arr.shape[-1])
    if np.any(bad):
        worst = sums[bad].flat[0] if np.ndim(sums) else float(sums)
        raise SpecboundError(
            f"{name} is not stochastic: a row sums to {worst:.12g} instead of 1"
        )
    return np.clip(arr, 0.0, None)


def tv(a, b) -> np.ndarray:
    """Total-variation distance TV(a, b) = ½ Σ|a − b| over the last axis (Yin et al. 2024, §1)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return 0.5 * np.abs(a - b).sum(axis=-1)


def overlap(a, b) -> np.ndarray:
    """Σ min(a, b) = 1 − TV(a, b): the acceptance probability of standard speculative decoding
    (Yin et al. 2024, Thm 1 per position; Leviathan et al. 2023's α)."""
    return np.minimum(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)).sum(axis=-1)


def residual(*, target, draft, accept=None) -> np.ndarray:
    """Law of the recovered token after a rejection: [target − accept·draft]_+ normalised.

    Keyword-only (``target`` first, then ``draft``): both arrays share a shape, so a positional swap
    would silently give a wrong law.

    With ``accept=None`` the acceptance is the standard min(1, target/draft) and the residual is the
    normalised positive part [target − draft]_+ / TV(draft, target) (Yin et al. 2024, Alg. 1).
    For any acceptance b ≤ min(1, target/draft) this is the unique residual that keeps the output
    unbiased (Thm 2's family); for over-acceptance b ≥ min(1, target/draft) it is the optimal
    residual P* of Thm 4 (Decoding-OPT). Where the positive part has no mass (no rejection can
    happen) the target itself is returned, so the result is always a distribution.
    """
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    if accept is None:
        excess = np.clip(target - draft, 0.0, None)
    else:
        excess = np.clip(target - np.asarray(accept, dtype=np.float64) * draft, 0.0, None)
    mass = excess.sum(axis=-1, keepdims=True)
    safe = np.where(mass > 0, mass, 1.0)
    return np.where(mass > 0, excess / safe, target)


def _p_and_logp(probs):
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
    return p, logp


def entropy(probs) -> np.ndarray:
    """Shannon entropy H(p) = −Σ p ln p in nats, with 0·ln 0 = 0 (its mean over contexts is the μ of
    Pankratov & Alistarh 2026, §3.1)."""
    p, logp = _p_and_logp(probs)
    return -(p * logp).sum(axis=-1)


def surprisal_moments(probs) -> tuple[np.ndarray, np.ndarray]:
    """First and second moments of the surprisal Y = −ln p(x), x ~ p, per row, in nats.

    Returns (H, m2) with H = Σ p(−ln p) (the entropy) and m2 = Σ p (ln p)² (the second log-moment
    μ_(2) of Pankratov & Alistarh 2026 when averaged over contexts).
    """
    p, logp = _p_and_logp(probs)
    return -(p * logp).sum(axis=-1), (p * logp * logp).sum(axis=-1)
