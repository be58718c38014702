"""Speed-of-light bounds for deterministic (tree) drafting, Pankratov & Alistarh 2026 (NumPy only).

All quantities are in nats. μ = E_ctx[H(target(·|ctx))] is the mean entropy of the target's
next-token law and μ₂ = E_ctx[Σ_a target(a) ln² target(a)] = E[Y²] the second moment of the per-token
surprisal Y = −ln target(x), x ~ target (§3.1; that the paper's μ_(2) is this moment is our inference).
The bounds cap the expected number X of accepted draft tokens per iteration for a verifier capacity P;
the bonus token is *not* counted (speed-up under the constant-time model is X + 1). "§N" are sections of
docs/paper-notes.md (Pankratov part). Every function takes ``units="nats"`` (default) or ``"bits"``; bits
are converted to nats before anything is evaluated, so every form — the published one, which mixes log
and log² units, included — is the same number whichever unit the moments arrive in (§3.1, §6.3).
Inputs that contradict Jensen (μ₂ < μ²) — the usual symptom of mixing bits and nats or of passing
Var(Y) instead of E[Y²] — raise :class:`SpecboundError`. In full: docs/notes.md (`theory/bounds.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SpecboundError
from .distributions import as_distribution, surprisal_moments

__all__ = [
    "entropy_moments",
    "MomentEstimate",
    "estimate_moments",
    "pool_moments",
    "speed_of_light",
    "bound_all_forms",
    "bound_is_valid",
    "BOUND_FORMS",
]

BOUND_FORMS = ("published", "renewal", "threshold", "asymptotic")
_LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------------
# moments
# ---------------------------------------------------------------------------------------------------
def entropy_moments(probs) -> tuple[np.ndarray, np.ndarray]:
    """Per-row entropy H = −Σ p ln p and second log-moment m2 = Σ p ln² p of the target, in nats.

    Pankratov & Alistarh 2026, §3.4: H and m2 are the first two moments of the surprisal
    Y = −ln p(x), x ~ p; averaging them over contexts gives μ and μ₂. Rows are on the last
    axis; each must be a probability vector (0·ln 0 = 0).
    """
    probs = as_distribution(probs, "probs")
    return surprisal_moments(probs)


@dataclass(frozen=True)
class MomentEstimate:
    """Estimated surprisal moments over n contexts (nats), Pankratov & Alistarh 2026, §3.4: THE record
    of a moments estimate (the theory's, the measurement layer's, ``advise``'s and the studies').

    mu = mean H, mu2 = mean Σ p ln² p (= E[Y²], the μ₂ the bounds use), mean_H2 = E[H²] (the
    literal "entropy's second moment" reading, ≤ mu2 by Jensen), var_surprisal = Var(Y) = mu2 − mu²
    of the pooled surprisal (mixing over contexts), se_mu / se_mu2 = standard errors of mu / mu2
    across contexts (NaN when n < 2). When the contexts come in groups — the positions of one sampled
    text, which correlate — se_mu_prompt / se_mu2_prompt are the standard errors across the
    n_prompts group means (NaN without groups or with fewer than two). std_H is the spread of H over
    contexts and frac_H_below_0p1 the share of contexts with H < 0.1 nats (nearly deterministic).
    """

    mu: float
    mu2: float
    mean_H2: float
    var_surprisal: float
    n: int
    se_mu: float
    se_mu2: float
    se_mu_prompt: float = float("nan")
    se_mu2_prompt: float = float("nan")
    n_prompts: int = 0
    std_H: float = float("nan")
    frac_H_below_0p1: float = float("nan")

    def bound(self, capacity, form: str = "renewal"):
        """:func:`speed_of_light` with these moments."""
        return speed_of_light(self.mu, self.mu2, capacity, form=form)


def _se(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / math.sqrt(values.size)) if values.size >= 2 else float("nan")


def pool_moments(H, m2, groups=None) -> MomentEstimate:
    """The :class:`MomentEstimate` of per-context entropies ``H`` = −Σ p ln p and second log-moments
    ``m2`` = Σ p ln² p (nats; Pankratov & Alistarh 2026, §3.4): μ, μ₂, E[H²], Var(Y) = μ₂ − μ², the
    per-context standard errors and, with ``groups`` (one label per context: the prompt whose sampled
    text a position belongs to), the standard errors across the group means."""
    H = np.asarray(H, dtype=np.float64).reshape(-1)
    m2 = np.asarray(m2, dtype=np.float64).reshape(-1)
    if H.size == 0 or H.shape != m2.shape:
        raise SpecboundError(f"moments need one H and one m2 per context (at least one), got {H.size} and {m2.size}")
    mu, mu2 = float(H.mean()), float(m2.mean())
    grouped = {}
    if groups is not None:
        labels = np.asarray(groups).reshape(-1)
        if labels.shape != H.shape:
            raise SpecboundError(f"groups must label every context: {labels.size} labels for {H.size} contexts")
        order = list(dict.fromkeys(labels.tolist()))
        means_H = np.array([H[labels == g].mean() for g in order])
        means_m2 = np.array([m2[labels == g].mean() for g in order])
        grouped = dict(se_mu_prompt=_se(means_H), se_mu2_prompt=_se(means_m2), n_prompts=len(order))
    return MomentEstimate(mu=mu, mu2=mu2, mean_H2=float((H * H).mean()), var_surprisal=mu2 - mu * mu,
                          n=int(H.size), se_mu=_se(H), se_mu2=_se(m2), std_H=float(H.std()),
                          frac_H_below_0p1=float(np.mean(H < 0.1)), **grouped)


def _log_softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits / temperature
    if np.any(np.isnan(z)) or np.any(z == np.inf):
        raise SpecboundError("logits contain NaN or +inf")
    zmax = z.max(axis=-1, keepdims=True)
    if np.any(zmax == -np.inf):
        raise SpecboundError("a logits row is entirely -inf (no token has positive probability)")
    shifted = z - zmax
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def estimate_moments(rows, temperature: float = 1.0, from_logits: bool = False) -> MomentEstimate:
    """Estimate μ, μ₂, E[H²], Var(Y) and standard errors from target next-token rows.

    Pankratov & Alistarh 2026, §3.4. ``rows`` is (n, V) (a single 1-D row is n = 1): target
    probabilities, or logits with ``from_logits=True``. Logits go through a stable float64
    log-softmax of logits / temperature (−inf logits are masked tokens). Probabilities are tempered
    the same way (p^{1/T} renormalised, computed in log space; zeros stay zero). ``temperature``
    must be > 0: greedy decoding (T → 0) has zero entropy and the bounds are meaningless there.
    """
    temperature = float(temperature)
    if not math.isfinite(temperature) or temperature <= 0:
        raise SpecboundError(
            f"temperature must be a finite number > 0, got {temperature} (T = 0 is greedy decoding: "
            "zero entropy, no bound)"
        )
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise SpecboundError(f"rows must be shaped (n, V) with n, V >= 1, got {np.shape(rows)}")
    if from_logits:
        logp = _log_softmax(arr, temperature)
    else:
        probs = as_distribution(arr, "rows (probabilities; pass from_logits=True for logits)")
        if temperature == 1.0:
            with np.errstate(divide="ignore"):
                logp = np.log(probs)
        else:
            with np.errstate(divide="ignore"):
                logp = _log_softmax(np.log(probs), temperature)
    probs = np.exp(logp)
    safe_logp = np.where(probs > 0, logp, 0.0)
    return pool_moments(-(probs * safe_logp).sum(axis=-1), (probs * safe_logp * safe_logp).sum(axis=-1))


# ---------------------------------------------------------------------------------------------------
# bounds
# ---------------------------------------------------------------------------------------------------
def _to_nats(mu, mu2, units: str):
    if units == "nats":
        return mu, mu2
    if units == "bits":
        return mu * _LN2, mu2 * _LN2 * _LN2
    raise SpecboundError(f"units must be 'nats' or 'bits', got {units!r}")


def _check_moments(mu, mu2, units: str):
    mu = np.asarray(mu, dtype=np.float64)
    mu2 = np.asarray(mu2, dtype=np.float64)
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(mu2))):
        raise SpecboundError("mu and mu2 must be finite")
    if np.any(mu <= 0):
        raise SpecboundError(
            f"mu (mean entropy) must be > 0, got {mu.min():.6g}; with zero entropy the oracle tree "
            "is a single chain and E[X] = P (no logarithmic bound applies)"
        )
    mu, mu2 = _to_nats(mu, mu2, units)
    if np.any(mu2 < mu * mu * (1 - 1e-9)):
        raise SpecboundError(
            f"mu2 = {np.min(mu2):.6g} < mu**2 = {np.max(mu * mu):.6g} ({units}) contradicts Jensen: "
            "mu2 must be the second log-moment E[Y^2] = E[sum p ln^2 p] >= E[Y]^2. Check that mu and "
            "mu2 are in the same units (bits vs nats: pass units='bits' for log2 moments) and that mu2 "
            "is E[Y^2] — not Var(Y), a standard deviation, or E[H^2] from different rows"
        )
    return mu, mu2


def _check_capacities(capacity) -> np.ndarray:
    cap = np.asarray(capacity, dtype=np.float64) if not isinstance(capacity, bool) else None
    if cap is None or not np.all(np.isfinite(cap)) or np.any(cap < 1):
        raise SpecboundError(f"capacity must be >= 1 (number of draft-tree nodes), got {capacity!r}")
    return cap


def _threshold(mu, mu2, cap):
    """min_{t≥0} t/μ + μ₂/μ² − 1 + P e^{−t}: t* = ln(μP) if μP ≥ 1, else t* = 0 (then = μ₂/μ² − 1 + P)."""
    mp = mu * cap
    inner = np.log(np.maximum(mp, 1.0)) / mu + 1.0 / mu + mu2 / mu**2 - 1.0
    edge = mu2 / mu**2 - 1.0 + cap
    return np.where(mp >= 1.0, inner, edge)


def speed_of_light(mu, mu2, capacity, form: str = "renewal", units: str = "nats"):
    """Upper bound (or asymptotic value) of E[X] for capacity P: Pankratov & Alistarh 2026, §3.

    Forms (μ, μ₂ in nats after conversion; X excludes the bonus token): ``"published"``, (μ + μ₂)·ln P /
    μ², the paper's headline bound without its O(1) (§3.1), a bound only for P ≥ 3 (§3.3, §6.1);
    ``"renewal"`` (default), ln P/μ + μ₂/μ², the renewal/Wald/Lorden bound at threshold t = ln P (§3.3),
    rigorous for every P ≥ 1 under the i.i.d. assumption; ``"threshold"``, that bound minimised over t ≥ 0
    in closed form (t* = ln(μP) when μP ≥ 1, else t = 0: μ₂/μ² − 1 + P), never larger than ``"renewal"``;
    ``"asymptotic"``, ln(μP)/μ + μ₂/(2μ²) − 1, the key-renewal approximation of E[X | T*(P)] as P → ∞ for
    non-lattice surprisals (§3.3), NOT a bound. Why each holds where it does: docs/notes.md
    (`theory/bounds.py`, ``speed_of_light``).

    ``capacity`` may be a scalar or array (result has its shape, broadcast with μ, μ₂); real
    values ≥ 1 are accepted for smooth curves. ``units="bits"`` converts μ·ln 2, μ₂·ln² 2 first.
    Raises :class:`SpecboundError` for μ ≤ 0, μ₂ < μ² (Jensen: wrong units or wrong moment), or P < 1.
    """
    mu, mu2 = _check_moments(mu, mu2, units)
    cap = _check_capacities(capacity)
    log_p = np.log(cap)
    if form == "published":
        out = (mu + mu2) * log_p / mu**2
    elif form == "renewal":
        out = log_p / mu + mu2 / mu**2
    elif form == "threshold":
        out = _threshold(mu, mu2, cap)
    elif form == "asymptotic":
        out = np.log(mu * cap) / mu + mu2 / (2 * mu**2) - 1.0
    else:
        raise SpecboundError(f"form must be one of {BOUND_FORMS}, got {form!r}")
    out = np.asarray(out, dtype=np.float64)
    return float(out) if out.ndim == 0 else out


def bound_is_valid(form: str, capacity) -> np.ndarray | bool:
    """Whether :func:`speed_of_light` ``form`` is a proven upper bound on E[X | T*(P)] at capacity P.

    Pankratov & Alistarh 2026, §3.3 (docs/paper-notes.md, Pankratov §6.1): "renewal" and "threshold"
    are bounds for every P ≥ 1 (i.i.d. surprisals); "published" only for P ≥ 3 (its derivation needs
    ln P ≥ 1; at P = 1 it is 0, below the optimum); "asymptotic" never (an approximation). Returns a
    bool (scalar P) or bool array.
    """
    if form not in BOUND_FORMS:
        raise SpecboundError(f"form must be one of {BOUND_FORMS}, got {form!r}")
    cap = _check_capacities(capacity)
    if form == "published":
        out = cap >= 3
    else:
        out = np.full(cap.shape, form != "asymptotic")
    return bool(out) if out.ndim == 0 else out


def bound_all_forms(mu, mu2, capacities, units: str = "nats") -> dict[str, np.ndarray]:
    """All four forms of :func:`speed_of_light` at ``capacities`` (Pankratov & Alistarh 2026, §3).

    Returns {"capacity", "published", "renewal", "threshold", "asymptotic"} → 1-D float arrays, plus a
    per-form flag ``"<form>_is_bound"`` → 1-D bool array (:func:`bound_is_valid`): "renewal" and
    "threshold" are bounds at every P ≥ 1, "published" only at P ≥ 3 (it is 0 at P = 1, below the
    optimum), "asymptotic" nowhere (an approximation, not a bound).
    """
    cap = np.atleast_1d(_check_capacities(capacities)).astype(np.float64)
    out = {"capacity": cap}
    for form in BOUND_FORMS:
        out[form] = np.atleast_1d(speed_of_light(mu, mu2, cap, form=form, units=units))
    for form in BOUND_FORMS:
        out[f"{form}_is_bound"] = np.atleast_1d(bound_is_valid(form, cap))
    return out
