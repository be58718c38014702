"""Expected rejections of speculative decoding on Markov chains (Yin et al. 2024, §3).

Conventions: ``draft`` and ``target`` are :class:`MarkovChain` s over the same states; the prefix
x_{1:n-1} is summarised by the current state, and prefixes are distributed as under the target
(the accepted prefix has the target's law, Thm 1).
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecboundError
from .chains import MarkovChain
from .distributions import as_distribution, residual, tv

__all__ = [
    "standard_acceptance",
    "expected_rejections",
    "rejections_per_position",
    "check_rejection_based",
    "rejection_based_output",
    "rejection_based_expected_rejections",
    "random_rejection_based_acceptance",
    "residual_chain",
    "batch_expected_rejections",
    "batch_rejections_per_position",
    "batch_improvement",
    "batch_rejections_limit",
    "batch_round_starts",
    "bernoulli_all_reject",
    "bernoulli_batch_improvement",
    "uniform_all_reject",
    "uniform_batch_improvement",
    "simulate_batch_rejections",
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


# ====================================================================== batch speculative decoding
#
# Yin et al. 2024, Alg. 4 / Thm 3 / Prop. 1. M = ``drafts`` draft sequences are sampled i.i.d.
# from the draft model at the start of a round and scored by the target in one oracle call.
# Candidates for one position are verified by recursive rejection sampling (RRS): candidate k is
# tested against the residual r^{k-1} (acceptance min(1, r^{k-1}/draft)); on rejection the
# residual is updated r^k = [r^{k-1} − draft]_+ / TV(draft, r^{k-1}). If every candidate is
# rejected, the token is drawn from r^M and a new round starts at the next position.
#
# Two branching rules (yin2024.md §2; the paper's exact rule is an open point):
#   design "B": only the round's first position uses the M candidates; after an acceptance only
#               the accepted sequence continues (plain Alg. 1 for the rest of the round).
#   design "A": full prefix-tree DFS; at every position all candidates that agree with the
#               accepted prefix are tried with residual updates.

_DESIGNS = ("A", "B")


def _check_drafts(drafts) -> int:
    if isinstance(drafts, bool) or not isinstance(drafts, (int, np.integer)):
        raise SpecboundError(f"drafts must be an integer >= 1 (number of draft sequences), got {drafts!r}")
    if drafts < 1:
        raise SpecboundError(f"drafts must be >= 1 (number of draft sequences), got {drafts}")
    return int(drafts)


def _check_design(design) -> str:
    key = str(design).upper()
    if key not in _DESIGNS:
        raise SpecboundError(f"design must be 'A' (prefix-tree DFS) or 'B' (branch at round start), got {design!r}")
    return key


def _unnormalised_residuals(draft_probs: np.ndarray, target_probs: np.ndarray, drafts: int) -> np.ndarray:
    """R^k = ρ_k · r^k for k = 0..M, shaped (..., M+1, V): R^0 = target, R^{k+1} = [R^k − ρ_k·draft]_+.

    ρ_k = Σ R^k is the probability that the first k candidates are all rejected. This form needs no
    division, so it stays exact when TV(draft, r^k) = 0 (then R^{k+1} = 0: the process has stopped).
    """
    shape = np.broadcast_shapes(draft_probs.shape, target_probs.shape)
    draft_probs = np.broadcast_to(draft_probs, shape)
    out = np.empty(shape[:-1] + (drafts + 1, shape[-1]))
    out[..., 0, :] = target_probs
    for k in range(drafts):
        prev = out[..., k, :]
        rho = prev.sum(axis=-1, keepdims=True)
        out[..., k + 1, :] = np.clip(prev - rho * draft_probs, 0.0, None)
    return out


def residual_chain(draft_probs, target_probs, drafts: int) -> tuple[np.ndarray, np.ndarray]:
    """Residual sequence of recursive rejection sampling with ``drafts`` i.i.d. draft candidates.

    Yin et al. 2024, Thm 3 (batch SD, Alg. 4): r^0 = target, r^{k+1} = [r^k − draft]_+ / TV(draft, r^k),
    and the all-reject probabilities ρ_k = Π_{i<k} TV(draft, r^i) (ρ_0 = 1, ρ_1 = TV(draft, target)).

    Works over the last axis and broadcasts over leading axes. Returns ``(residuals, all_reject)``
    with residuals[..., k, :] = r^k shaped (..., M+1, V) and all_reject[..., k] = ρ_k shaped (..., M+1),
    for k = 0..M. When TV(draft, r^k) = 0 the candidate is accepted for sure and the process stops:
    ρ = 0 from k+1 on, and r^{k+1}, r^{k+2}, ... are frozen at the last defined residual r^k
    (they are never sampled from; their weight ρ is 0).
    """
    drafts = _check_drafts(drafts)
    draft_probs = as_distribution(draft_probs, "draft_probs")
    target_probs = as_distribution(target_probs, "target_probs")
    if draft_probs.shape[-1] != target_probs.shape[-1]:
        raise SpecboundError(
            f"draft_probs has {draft_probs.shape[-1]} tokens but target_probs has {target_probs.shape[-1]}"
        )
    unnorm = _unnormalised_residuals(draft_probs, target_probs, drafts)
    rho = unnorm.sum(axis=-1)                                   # (..., M+1)
    residuals = np.empty_like(unnorm)
    residuals[..., 0, :] = target_probs
    for k in range(1, drafts + 1):
        alive = rho[..., k, None] > 0
        safe = np.where(alive, rho[..., k, None], 1.0)
        residuals[..., k, :] = np.where(alive, unnorm[..., k, :] / safe, residuals[..., k - 1, :])
    return residuals, rho


def _batch_b_terms(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int | None):
    """Per-position rejections and round-start measures f_n of design B (``drafts=None``: M → ∞)."""
    horizon = _check_pair(draft, target, horizon)
    draft_mats = draft.stack(horizon)
    target_mats = target.stack(horizon)
    mu = target.marginals(horizon)[:-1]                          # (T, S): laws of x_{n-1}
    tv_n = np.clip(target_mats - draft_mats, 0.0, None).sum(-1)  # (T, S) = TV(draft_n, target_n)
    excess = np.clip(target_mats - draft_mats, 0.0, None)        # [target − draft]_+, (T, S, S)
    if drafts is None:
        # Prop. 1: ρ_M → target mass outside supp(draft) and ρ_M r^M → target on that set.
        # (With supp target ⊆ supp draft this is 0 and the note's limit recursion is recovered.)
        all_reject_mass = np.where(draft_mats > 0, 0.0, target_mats)
    else:
        all_reject_mass = _unnormalised_residuals(draft_mats, target_mats, drafts)[..., -1, :]
    rho = all_reject_mass.sum(-1)                                # (T, S) = ρ_M
    f = np.empty_like(mu)
    f[0] = target.initial
    for n in range(horizon - 1):
        f[n + 1] = f[n] @ all_reject_mass[n] + (mu[n] - f[n]) @ excess[n]
    per_position = (f * rho + (mu - f) * tv_n).sum(-1)
    improvement = (f * (tv_n - rho)).sum(-1)
    return per_position, improvement, f


def _design_a_per_position(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int,
                           branching: bool = True) -> np.ndarray:
    """Per-position rejections of design A by a recursion over (state, surviving candidates).

    g_n[s, j-1] = P(x_{n-1} = s and j candidates are alive at position n). Given that, the alive
    candidates' tokens at n are i.i.d. draft_n(·|s) (their continuations are drawn independently of
    everything verified so far), so position n is RRS with j candidates:
      * all j rejected (prob ρ_j): rejection, x_n ~ r^j, new round with M fresh candidates;
      * candidate k accepts token y (prob a_k(y) = min(ρ_{k-1}·draft(y), R^{k-1}(y))): the
        candidates before k carry other tokens (a rejected token has residual mass 0), each of the
        j − k later ones carries y independently with prob draft(y), so j' = 1 + Binomial(j − k, draft(y))
        candidates survive into position n+1.
    ``branching=False`` keeps only the accepted candidate (j' = 1): that is design B.
    """
    from scipy.stats import binom

    horizon = _check_pair(draft, target, horizon)
    draft_mats = draft.stack(horizon)
    target_mats = target.stack(horizon)
    n_states, m = draft.n_states, drafts
    unnorm = _unnormalised_residuals(draft_mats, target_mats, m)        # (T, S, M+1, V)
    rho = unnorm.sum(-1)                                                  # (T, S, M+1)
    # a[n, s, k-1, y] = P(candidate k reached, draws y, accepts) for k = 1..M
    accept_mass = np.minimum(rho[..., :-1, None] * draft_mats[:, :, None, :], unnorm[..., :-1, :])
    # Hankel index for c[d, y] = Σ_k g[k-1+d] a_k(y)
    k0 = np.arange(m)
    hankel = k0[None, :] + k0[:, None]                                    # [d, k0] -> j0
    valid = hankel < m
    hankel = np.where(valid, hankel, 0)
    counts = np.arange(m)
    g = np.zeros((n_states, m))
    g[:, m - 1] = target.initial
    per_position = np.zeros(horizon)
    for n in range(horizon):
        per_position[n] = (g * rho[n, :, 1:]).sum()
        if n == horizon - 1:
            break
        new = np.zeros((n_states, m))
        for s in range(n_states):
            gs = g[s]
            if not np.any(gs > 0):
                continue
            new[:, m - 1] += gs @ unnorm[n, s, 1:, :]                     # all j rejected
            hank = np.where(valid, gs[hankel], 0.0)                       # (d, k0)
            c = hank @ accept_mass[n, s]                                  # (d, y)
            if branching:
                # binom_pmf[y, d, i] = P(Binomial(d, draft(y)) = i)
                pmf = binom.pmf(counts[None, None, :], counts[None, :, None],
                                draft_mats[n, s][:, None, None])
                new += np.einsum("dy,ydi->yi", c, pmf)
            else:
                new[:, 0] += c.sum(0)
        g = new
    return per_position


def batch_rejections_per_position(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int,
                                  design: str = "B") -> np.ndarray:
    """P(R_n = 1) for n = 1..T under batch SD with ``drafts`` candidates (Yin et al. 2024, Thm 3).

    Design "B" uses the round-start recursion of yin2024.md §3, design "A" the (state, surviving
    candidates) recursion (see :func:`batch_expected_rejections`).
    """
    drafts = _check_drafts(drafts)
    if _check_design(design) == "B":
        return _batch_b_terms(draft, target, horizon, drafts)[0]
    return _design_a_per_position(draft, target, horizon, drafts)


def batch_expected_rejections(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int,
                              design: str = "B") -> float:
    """Exact E[N_rej] of batch speculative decoding with M = ``drafts`` i.i.d. draft sequences.

    Yin et al. 2024, Thm 3 (Alg. 4). Design "B" (branching only at the round start; default): with the
    round-start measure f_1 = initial,
        f_{n+1}(y) = Σ_s f_n(s)·ρ_M(s)·r^M(y|s) + (μ_{n-1}(s) − f_n(s))·[target_n − draft_n]_+(s, y),
        E[N_rej] = Σ_n Σ_s [ f_n(s)·ρ_M(s) + (μ_{n-1}(s) − f_n(s))·TV_n(s) ]
                 = Thm 1 − Σ_n Σ_s f_n(s)·(TV_n(s) − ρ_M(s)),
    where μ_{n-1} is the target marginal of x_{n-1} (the output is unbiased) and ρ_M, r^M come from
    :func:`residual_chain`. M = 1 is Thm 1.

    Design "A" (full prefix-tree DFS, a derived reconstruction): exact recursion over
    (state, number of surviving candidates); see ``_design_a_per_position``. Cost O(T·S²·M²).
    """
    return float(batch_rejections_per_position(draft, target, horizon, drafts, design).sum())


def batch_improvement(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int,
                      design: str = "B") -> float:
    """Batch improvement E[N_rej^SD] − E[N_rej^batch] ≥ 0 (Yin et al. 2024, Thm 3).

    For design B it is computed directly as Σ_n Σ_s f_n(s)·(TV_n(s) − ρ_M(s)) (no cancellation).
    """
    drafts = _check_drafts(drafts)
    if _check_design(design) == "B":
        return float(_batch_b_terms(draft, target, horizon, drafts)[1].sum())
    return expected_rejections(draft, target, horizon) - batch_expected_rejections(
        draft, target, horizon, drafts, design)


def batch_rejections_limit(draft: MarkovChain, target: MarkovChain, horizon: int) -> float:
    """lim_{M→∞} E[N_rej^batch] under design B (Yin et al. 2024, Prop. 1).

    As M → ∞, ρ_M → target mass outside supp(draft) (0 when supp target ⊆ supp draft), so
        f_{n+1}^∞(y) = Σ_s f_n^∞(s)·target_n(y|s)·1[draft_n(y|s) = 0] + (μ_{n-1}(s) − f_n^∞(s))·[target_n − draft_n]_+(s, y)
    and the limit is Σ_n Σ_s [f_n^∞·ρ_∞ + (μ_{n-1} − f_n^∞)·TV_n], which stays > 0: only the first
    token of each round benefits from more drafts.
    """
    return float(_batch_b_terms(draft, target, horizon, None)[0].sum())


def batch_round_starts(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int | None) -> np.ndarray:
    """Round-start measure f_n(s) = P(x_{n-1} = s, a round starts at n), shaped (T, S), design B.

    Yin et al. 2024, Thm 3 / Prop. 1 (``drafts=None`` gives the M → ∞ measure f^∞).
    """
    if drafts is not None:
        drafts = _check_drafts(drafts)
    return _batch_b_terms(draft, target, horizon, drafts)[2]


# ---------------------------------------------------------------------- closed forms (§3, Fig. 3)

def _prob_array(x, name):
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise SpecboundError(f"{name} must be probabilities in [0, 1], got {x!r}")
    return arr


def _drafts_array(drafts):
    arr = np.asarray(drafts)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 1):
        raise SpecboundError(f"drafts must be integer(s) >= 1, got {drafts!r}")
    return arr


def bernoulli_all_reject(draft_p1, target_p1, drafts):
    """ρ_M for draft = Ber(a), target = Ber(c): |c − a|·(1 − draft(x*))^{M−1} (Yin et al. 2024, Thm 3).

    x* is the token where target > draft (x* = 1 if c > a, else 0); after the first rejection the
    residual is δ_{x*}. Broadcasts over its arguments. (Derived closed form, yin2024.md §3.)
    """
    a = _prob_array(draft_p1, "draft_p1")
    c = _prob_array(target_p1, "target_p1")
    m = _drafts_array(drafts)
    draft_at_star = np.where(c > a, a, 1.0 - a)
    return np.abs(c - a) * (1.0 - draft_at_star) ** (m - 1)


def bernoulli_batch_improvement(draft_p1, target_p1, drafts):
    """One-round-start batch improvement TV − ρ_M = |c − a|·(1 − (1 − draft(x*))^{M−1}) (Yin et al. 2024, Thm 3)."""
    a = _prob_array(draft_p1, "draft_p1")
    c = _prob_array(target_p1, "target_p1")
    return np.abs(c - a) - bernoulli_all_reject(a, c, drafts)


def _uniform_sizes(k, m):
    k_arr, m_arr = np.asarray(k), np.asarray(m)
    for arr, name in ((k_arr, "k"), (m_arr, "m")):
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 1):
            raise SpecboundError(f"{name} must be integer(s) >= 1, got {arr!r}")
    if np.any(m_arr > k_arr):
        raise SpecboundError("target support m must be a subset of the draft support k (m <= k)")
    return k_arr, m_arr


def uniform_all_reject(k, m, drafts):
    """ρ_M = (1 − m/k)^M for draft uniform on k tokens, target uniform on m of them (Yin et al. 2024, Thm 3).

    Every residual equals the target (uniform on its m tokens), so each candidate is rejected with
    probability TV = 1 − m/k independently. (Derived closed form, yin2024.md §3.)
    """
    k_arr, m_arr = _uniform_sizes(k, m)
    return (1.0 - m_arr / k_arr) ** _drafts_array(drafts)


def uniform_batch_improvement(k, m, drafts):
    """One-round-start batch improvement TV − ρ_M = (1 − m/k) − (1 − m/k)^M (Yin et al. 2024, Thm 3)."""
    k_arr, m_arr = _uniform_sizes(k, m)
    return (1.0 - m_arr / k_arr) - uniform_all_reject(k_arr, m_arr, drafts)


# ---------------------------------------------------------------------- Monte Carlo (pure NumPy)

def _categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One draw per row of ``probs`` (..., V) by inverse CDF."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[:-1])[..., None] * cdf[..., -1:]
    return (u >= cdf).sum(axis=-1).clip(max=probs.shape[-1] - 1)


def _rrs_residual_step(resid: np.ndarray, draft_rows: np.ndarray, target_rows: np.ndarray) -> np.ndarray:
    """r ← [r − draft]_+ / TV(draft, r): the residual update after a rejected candidate."""
    excess = np.clip(resid - draft_rows, 0.0, None)
    mass = excess.sum(-1, keepdims=True)
    return np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), resid)


def _simulate_batch(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int, design: str,
                    n_runs: int, rng: np.random.Generator, residual_step=_rrs_residual_step):
    """Vectorised simulation of Alg. 4; returns (rejections per run, paths x_0..x_T)."""
    horizon = _check_pair(draft, target, horizon)
    draft_mats = draft.stack(horizon)
    target_mats = target.stack(horizon)
    n, m = n_runs, drafts
    paths = np.empty((n, horizon + 1), dtype=np.int64)
    paths[:, 0] = _categorical(rng, np.broadcast_to(target.initial, (n, target.n_states)))
    tokens = np.zeros((n, m, horizon + 1), dtype=np.int64)     # tokens[i, k, t]: candidate k at position t
    alive = np.zeros((n, m), dtype=bool)
    rejections = np.zeros(n, dtype=np.int64)
    new_round = np.ones(n, dtype=bool)
    for t in range(1, horizon + 1):
        starts = np.flatnonzero(new_round)
        if starts.size:                                          # draw M fresh sequences for t..T
            prev = np.repeat(paths[starts, t - 1][:, None], m, axis=1)
            for u in range(t, horizon + 1):
                prev = _categorical(rng, draft_mats[u - 1][prev])
                tokens[starts, :, u] = prev
            alive[starts] = True
        state = paths[:, t - 1]
        draft_rows = draft_mats[t - 1][state]
        target_rows = target_mats[t - 1][state]
        resid = target_rows.copy()
        accepted = np.full(n, -1)
        for k in range(m):                                       # DFS over alive candidates, in order
            live = np.flatnonzero((accepted < 0) & alive[:, k])
            if live.size == 0:
                continue
            y = tokens[live, k, t]
            ok = rng.random(live.size) * draft_rows[live, y] < resid[live, y]   # u < r(y)/draft(y)
            accepted[live[ok]] = k
            bad = live[~ok]
            resid[bad] = residual_step(resid[bad], draft_rows[bad], target_rows[bad])
        acc = np.flatnonzero(accepted >= 0)
        y = tokens[acc, accepted[acc], t]
        paths[acc, t] = y
        if design == "A":
            alive[acc] &= tokens[acc, :, t] == y[:, None]
        else:
            alive[acc] = False
            alive[acc, accepted[acc]] = True
        rej = np.flatnonzero(accepted < 0)
        paths[rej, t] = _categorical(rng, resid[rej])
        rejections[rej] += 1
        new_round = accepted < 0
    return rejections, paths


def simulate_batch_rejections(draft: MarkovChain, target: MarkovChain, horizon: int, drafts: int,
                              design: str = "B", n_runs: int = 10_000, seed=None,
                              return_paths: bool = False):
    """Monte Carlo of batch speculative decoding (Yin et al. 2024, Alg. 4 / Thm 3), pure NumPy.

    Each round draws ``drafts`` i.i.d. draft sequences up to the horizon from the accepted prefix;
    candidates are verified by recursive rejection sampling with residual updates, branching as in
    design "A" (all candidates agreeing with the accepted prefix stay alive) or "B" (only the
    accepted candidate continues after the round start). ``drafts=1`` is Alg. 1 (Thm 1).

    Returns the number of rejections per run, shaped (n_runs,); with ``return_paths=True`` also the
    generated paths x_0..x_T, shaped (n_runs, T+1) (x_0 ~ target.initial), whose law is the target's.
    """
    drafts = _check_drafts(drafts)
    design = _check_design(design)
    if int(n_runs) < 1:
        raise SpecboundError(f"n_runs must be >= 1, got {n_runs}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    rejections, paths = _simulate_batch(draft, target, horizon, drafts, design, int(n_runs), rng)
    return (rejections, paths) if return_paths else rejections
