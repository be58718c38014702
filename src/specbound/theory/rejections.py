"""Expected rejections and target calls of speculative decoding on Markov chains (Yin et al. 2024, §3).

Conventions: ``target`` and ``draft`` are :class:`MarkovChain` s over the same states; the prefix
x_{1:n-1} is summarised by the current state, and prefixes are distributed as under the target
(the accepted prefix has the target's law, Thm 1).

Argument order: every function that takes a target and a draft takes them **keyword-only, target
first** (``target=..., draft=...``). The two share a type and a shape, so a positional swap would
give silently wrong numbers; keyword-only makes it a ``TypeError`` instead.
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecboundError
from .chains import MarkovChain
from .distributions import as_distribution, residual, tv

__all__ = [
    "standard_acceptance",
    "expected_rejections",
    "expected_target_calls",
    "rejections_per_position",
    "check_rejection_based",
    "rejection_based_output",
    "rejection_based_expected_rejections",
    "random_rejection_based_acceptance",
    "residual_chain",
    "batch_expected_rejections",
    "batch_expected_target_calls",
    "batch_rejections_per_position",
    "batch_improvement",
    "batch_rejections_limit",
    "batch_target_calls_limit",
    "batch_round_starts",
    "bernoulli_all_reject",
    "bernoulli_batch_improvement",
    "uniform_all_reject",
    "uniform_batch_improvement",
    "simulate_batch_rejections",
    "sampled_tree_value",
]


def _check_pair(*, target: MarkovChain, draft: MarkovChain, horizon: int | None) -> int:
    """Validate a (target, draft) pair of chains and resolve the horizon T.

    ``horizon=None`` means the chains' own horizon (the number of transition matrices of the
    non-stationary one(s)); it is an error when both chains are stationary or when their horizons differ.
    """
    if not isinstance(target, MarkovChain) or not isinstance(draft, MarkovChain):
        raise SpecboundError(
            "target and draft must be specbound.theory.MarkovChain instances, got "
            f"target={type(target).__name__}, draft={type(draft).__name__}"
        )
    if draft.n_states != target.n_states:
        raise SpecboundError(
            f"draft has {draft.n_states} states but target has {target.n_states}: vocabularies must match"
        )
    if horizon is None:
        own = {chain.horizon for chain in (target, draft) if chain.horizon is not None}
        if not own:
            raise SpecboundError("horizon is required: both chains are stationary, so neither fixes T")
        if len(own) > 1:
            raise SpecboundError(
                f"target has {target.horizon} transition matrices but draft has {draft.horizon}: "
                "pass horizon explicitly"
            )
        horizon = own.pop()
    horizon = target.check_horizon(horizon)
    draft.check_horizon(horizon)
    return horizon


def standard_acceptance(*, target, draft) -> np.ndarray:
    """b(x) = min(1, target(x)/draft(x)), the acceptance of Alg. 1 (Yin et al. 2024, Alg. 1).

    1 where the draft has no mass (such a token is never drafted). Works over the last axis.
    """
    draft = np.asarray(draft, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(draft > 0, target / np.where(draft > 0, draft, 1.0), 1.0)
    return np.minimum(1.0, ratio)


def rejections_per_position(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None) -> np.ndarray:
    """P(R_n = 1) for n = 1..T: E_{x_{n-1} ~ target}[TV(draft_n, target_n)] (Yin et al. 2024, Thm 1).

    Shaped (T,); empty for T = 0. Computed one step at a time (memory O(S²) beyond the chains).
    """
    horizon = _check_pair(target=target, draft=draft, horizon=horizon)
    out = np.zeros(horizon)
    mu = target.initial.copy()                                   # law of x_{n-1} under the target
    for n in range(horizon):
        target_mat, draft_mat = target.transition(n), draft.transition(n)
        out[n] = mu @ tv(draft_mat, target_mat)
        if n + 1 < horizon:
            mu = mu @ target_mat
    return out


def expected_rejections(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None) -> float:
    """Exact E[N_rej] of speculative decoding drafting to the horizon (Yin et al. 2024, Thm 1).

    E[N_rej] = Σ_{n=1}^T E_{x_{1:n-1} ~ target}[ TV(draft_n(·|x_{1:n-1}), target_n(·|x_{1:n-1})) ].

    This counts rejections, not rounds. A round ends at a rejection *or* when its last position T is
    accepted, so the number of target calls is N_rej + 1{position T accepted}, see
    :func:`expected_target_calls` (its expectation is E[N_rej] + 1 − P(R_T = 1), not E[N_rej]).
    The paper's acceleration T/E[N_rej] (Assumption 1) therefore ignores the final round; it is
    infinite for identical chains where the true ratio is T. ``horizon=None``: the chains' own T.
    """
    return float(rejections_per_position(target=target, draft=draft, horizon=horizon).sum())


def _calls_from_per_position(per_position: np.ndarray) -> float:
    """E[#rounds] = E[N_rej] + 1 − P(R_T = 1) for drafting to the horizon; 0 for T = 0 (see below)."""
    if per_position.size == 0:
        return 0.0
    return float(per_position.sum() + 1.0 - per_position[-1])


def expected_target_calls(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None) -> float:
    """Exact E[number of target calls] of Alg. 1 drafting to the horizon T (Yin et al. 2024, Alg. 1 / Thm 1).

    Derivation. Every round makes one target call. A round starting at position n drafts n..T and
    ends at its first rejection t (then x_t is resampled from the residual) or, with no rejection, after
    accepting position T. A rejection at t < T starts a new round at t + 1; a rejection at t = T or an
    accepted position T ends decoding. Hence

        #calls = #rounds = #{rejections at t < T} + 1 = N_rej − R_T + 1,
        E[#calls] = E[N_rej] + 1 − P(R_T = 1) = E[N_rej] + 1 − E_{x_{T-1} ~ target}[TV(draft_T, target_T)],

    with E[N_rej] from Thm 1 (:func:`expected_rejections`) and P(R_T = 1) its last per-position term.
    T = 0 makes no call (0). Bounds: 1 ≤ E[#calls] ≤ T for T ≥ 1 (identical chains: 1; disjoint: T).
    The speed-up over autoregressive decoding under Assumption 1 (one call costs O(1), drafting is
    free) is T / E[#calls].
    """
    return _calls_from_per_position(rejections_per_position(target=target, draft=draft, horizon=horizon))


def check_rejection_based(*, target, draft, accept, atol: float = 1e-12) -> np.ndarray:
    """Validate an acceptance b of the unbiased rejection-based family: 0 ≤ b ≤ min(1, target/draft).

    The family F of Yin et al. 2024, Thm 2 (unbiased ⇔ draft·b ≤ target pointwise).
    """
    accept = np.asarray(accept, dtype=np.float64)
    if accept.shape != np.shape(draft):
        raise SpecboundError(f"acceptance shape {accept.shape} != distribution shape {np.shape(draft)}")
    if np.any(accept < -atol) or np.any(accept > 1 + atol):
        raise SpecboundError("acceptance probabilities must lie in [0, 1]")
    excess = accept * np.asarray(draft) - np.asarray(target)
    if np.any(excess > atol):
        raise SpecboundError(
            "acceptance exceeds min(1, target/draft): this over-accepts and biases the output "
            "(use the relaxed/biased decoders for that)"
        )
    return np.clip(accept, 0.0, 1.0)


def rejection_based_output(*, target, draft, accept, resample=None) -> np.ndarray:
    """Output law of one rejection step: draft·b + (1 − β)·P with β = Σ draft·b (Yin et al. 2024, Thm 2).

    ``resample`` defaults to the residual [target − b·draft]_+ normalised.
    """
    draft = np.asarray(draft, dtype=np.float64)
    accept = np.asarray(accept, dtype=np.float64)
    if resample is None:
        resample = residual(target=target, draft=draft, accept=accept)
    beta = (draft * accept).sum(axis=-1, keepdims=True)
    return draft * accept + (1.0 - beta) * np.asarray(resample, dtype=np.float64)


def rejection_based_expected_rejections(*, target: MarkovChain, draft: MarkovChain, accept,
                                        horizon: int | None = None) -> float:
    """Exact E[N_rej] of an unbiased rejection-based algorithm with acceptance b (Yin et al. 2024, Thm 2).

    ``accept`` has the shape of the transitions, (S, S) or (T', S, S) with T' ≥ T: accept[n, s, y] is
    the probability of accepting drafted token y at step n+1 from state s. Because the algorithm is
    unbiased the prefix law is the target's, so E[N_rej] = Σ_n E_{x ~ target}[1 − Σ_y draft·b].
    Thm 2: this is never below :func:`expected_rejections`, with equality iff b = min(1, target/draft).
    """
    horizon = _check_pair(target=target, draft=draft, horizon=horizon)
    accept = np.asarray(accept, dtype=np.float64)
    states = target.n_states
    if accept.ndim not in (2, 3) or accept.shape[-2:] != (states, states) or \
            (accept.ndim == 3 and accept.shape[0] < horizon):
        raise SpecboundError(
            f"accept must be shaped ({states}, {states}) or (T, {states}, {states}) with T >= {horizon}, "
            f"got {accept.shape}"
        )
    total = 0.0
    mu = target.initial.copy()
    for n in range(horizon):
        target_mat, draft_mat = target.transition(n), draft.transition(n)
        b = check_rejection_based(target=target_mat, draft=draft_mat,
                                  accept=accept if accept.ndim == 2 else accept[n])
        total += float(mu @ (1.0 - (draft_mat * b).sum(axis=-1)))
        if n + 1 < horizon:
            mu = mu @ target_mat
    return total


def random_rejection_based_acceptance(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None,
                                      seed=None):
    """A random member of the unbiased family of Yin et al. 2024, Thm 2: b = u · min(1, target/draft),
    u ~ U[0, 1] per entry. Shaped (T, S, S)."""
    horizon = _check_pair(target=target, draft=draft, horizon=horizon)
    rng = np.random.default_rng(seed)
    base = standard_acceptance(target=target.stack(horizon), draft=draft.stack(horizon))
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
# The paper's exact branching rule is an open point (docs/paper-notes.md, Yin §2.2, §6.1). Two reconstructions:
#   design "B": only the round's first position uses the M candidates; after an acceptance only
#               the accepted sequence continues (plain Alg. 1 for the rest of the round). This is
#               the one consistent with Prop. 1 (M → ∞ leaves rejections > 0), and the one whose
#               f-recursion is the derived form of Thm 3 (docs/paper-notes.md, Yin §3.3).
#   design "A": full prefix-tree DFS; at every position all candidates that agree with the
#               accepted prefix are tried with residual updates. A DERIVED VARIANT, not the paper's
#               statement: its rejections keep falling toward 0 as M grows (when supp target ⊆
#               supp draft), contradicting Prop. 1. Its exact values come from our own recursion.

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


def _unnormalised_residuals(*, target: np.ndarray, draft: np.ndarray, drafts: int) -> np.ndarray:
    """R^k = ρ_k · r^k for k = 0..M, shaped (..., M+1, V): R^0 = target, R^{k+1} = [R^k − ρ_k·draft]_+.

    ρ_k = Σ R^k is the probability that the first k candidates are all rejected. This form needs no
    division, so it stays exact when TV(draft, r^k) = 0 (then R^{k+1} = 0: the process has stopped).
    """
    shape = np.broadcast_shapes(draft.shape, target.shape)
    draft = np.broadcast_to(draft, shape)
    out = np.empty(shape[:-1] + (drafts + 1, shape[-1]))
    out[..., 0, :] = target
    for k in range(drafts):
        prev = out[..., k, :]
        rho = prev.sum(axis=-1, keepdims=True)
        out[..., k + 1, :] = np.clip(prev - rho * draft, 0.0, None)
    return out


def _all_reject_mass(*, target: np.ndarray, draft: np.ndarray, drafts: int | None) -> np.ndarray:
    """ρ_M · r^M (unnormalised last residual R^M) over the last axis; ``drafts=None``: the M → ∞ limit.

    Same values as ``_unnormalised_residuals(...)[..., -1, :]`` but keeps only one residual in memory.
    As M → ∞, ρ_M → target mass outside supp(draft) and ρ_M r^M → target on that set (Prop. 1).
    """
    if drafts is None:
        return np.where(draft > 0, 0.0, target)
    mass = np.array(target, dtype=np.float64, copy=True)
    for _ in range(drafts):
        rho = mass.sum(axis=-1, keepdims=True)
        if not np.any(rho > 0):
            break
        mass -= rho * draft
        np.clip(mass, 0.0, None, out=mass)
    return mass


def residual_chain(*, target, draft, drafts: int) -> tuple[np.ndarray, np.ndarray]:
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
    draft = as_distribution(draft, "draft")
    target = as_distribution(target, "target")
    if draft.shape[-1] != target.shape[-1]:
        raise SpecboundError(f"draft has {draft.shape[-1]} tokens but target has {target.shape[-1]}")
    unnorm = _unnormalised_residuals(target=target, draft=draft, drafts=drafts)
    rho = unnorm.sum(axis=-1)                                   # (..., M+1)
    residuals = np.empty_like(unnorm)
    residuals[..., 0, :] = target
    for k in range(1, drafts + 1):
        alive = rho[..., k, None] > 0
        safe = np.where(alive, rho[..., k, None], 1.0)
        residuals[..., k, :] = np.where(alive, unnorm[..., k, :] / safe, residuals[..., k - 1, :])
    return residuals, rho


def _batch_b_terms(*, target: MarkovChain, draft: MarkovChain, horizon: int | None, drafts: int | None):
    """Per-position rejections, per-position improvement and round-start measures f_n of design B.

    ``drafts=None``: M → ∞. Returns arrays shaped (T,), (T,), (T, S); all empty for T = 0.
    Computed one step at a time: memory O(S²) beyond the chains themselves.
    """
    horizon = _check_pair(target=target, draft=draft, horizon=horizon)
    per_position = np.zeros(horizon)
    improvement = np.zeros(horizon)
    f = np.zeros((horizon, target.n_states))
    mu = target.initial.copy()                                   # law of x_{n-1}
    f_n = target.initial.copy()                                  # f_1 = initial: round 1 starts at n = 1
    for n in range(horizon):
        target_mat, draft_mat = target.transition(n), draft.transition(n)
        excess = np.clip(target_mat - draft_mat, 0.0, None)      # [target − draft]_+, (S, S)
        tv_n = excess.sum(-1)                                    # TV(draft_n, target_n), (S,)
        reject_mass = _all_reject_mass(target=target_mat, draft=draft_mat, drafts=drafts)
        rho = reject_mass.sum(-1)                                # ρ_M, (S,)
        f[n] = f_n
        per_position[n] = f_n @ rho + (mu - f_n) @ tv_n
        improvement[n] = f_n @ (tv_n - rho)
        if n + 1 < horizon:
            f_n = f_n @ reject_mass + (mu - f_n) @ excess
            mu = mu @ target_mat
    return per_position, improvement, f


def _design_a_per_position(*, target: MarkovChain, draft: MarkovChain, horizon: int | None, drafts: int,
                           branching: bool = True) -> np.ndarray:
    """Per-position rejections of design A (a derived variant of Yin et al. 2024, Alg. 4; not Thm 3).

    Recursion over (state, surviving candidates): g_n[s, j-1] = P(x_{n-1} = s and j candidates are
    alive at position n). Given that, the alive candidates' tokens at n are i.i.d. draft_n(·|s) (their
    continuations are drawn independently of everything verified so far), so position n is RRS with
    j candidates:
      * all j rejected (prob ρ_j): rejection, x_n ~ r^j, new round with M fresh candidates;
      * candidate k accepts token y (prob a_k(y) = min(ρ_{k-1}·draft(y), R^{k-1}(y))): the
        candidates before k carry other tokens (a rejected token has residual mass 0), each of the
        j − k later ones carries y independently with prob draft(y), so j' = 1 + Binomial(j − k, draft(y))
        candidates survive into position n+1.
    ``branching=False`` keeps only the accepted candidate (j' = 1): that is design B.
    Cost O(T·S²·M²); memory O(S²·M) per step.
    """
    from scipy.stats import binom

    horizon = _check_pair(target=target, draft=draft, horizon=horizon)
    n_states, m = draft.n_states, drafts
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
        target_mat, draft_mat = target.transition(n), draft.transition(n)
        unnorm = _unnormalised_residuals(target=target_mat, draft=draft_mat, drafts=m)   # (S, M+1, V)
        rho = unnorm.sum(-1)                                                             # (S, M+1)
        per_position[n] = (g * rho[:, 1:]).sum()
        if n == horizon - 1:
            break
        # a[s, k-1, y] = P(candidate k reached, draws y, accepts) for k = 1..M
        accept_mass = np.minimum(rho[:, :-1, None] * draft_mat[:, None, :], unnorm[:, :-1, :])
        new = np.zeros((n_states, m))
        for s in range(n_states):
            gs = g[s]
            if not np.any(gs > 0):
                continue
            new[:, m - 1] += gs @ unnorm[s, 1:, :]                        # all j rejected
            hank = np.where(valid, gs[hankel], 0.0)                       # (d, k0)
            c = hank @ accept_mass[s]                                     # (d, y)
            if branching:
                # binom_pmf[y, d, i] = P(Binomial(d, draft(y)) = i)
                pmf = binom.pmf(counts[None, None, :], counts[None, :, None],
                                draft_mat[s][:, None, None])
                new += np.einsum("dy,ydi->yi", c, pmf)
            else:
                new[:, 0] += c.sum(0)
        g = new
    return per_position


def batch_rejections_per_position(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None,
                                  drafts: int, design: str = "B") -> np.ndarray:
    """P(R_n = 1) for n = 1..T under batch SD with M = ``drafts`` candidates, shaped (T,).

    Design "B": Yin et al. 2024, Thm 3 (derived f-recursion, docs/paper-notes.md, Yin §3.3). Design "A": our derived
    (state, surviving candidates) recursion for the prefix-tree DFS variant, not a paper statement
    (see :func:`batch_expected_rejections`). Empty for T = 0.
    """
    drafts = _check_drafts(drafts)
    if _check_design(design) == "B":
        return _batch_b_terms(target=target, draft=draft, horizon=horizon, drafts=drafts)[0]
    return _design_a_per_position(target=target, draft=draft, horizon=horizon, drafts=drafts)


def batch_expected_rejections(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None,
                              drafts: int, design: str = "B") -> float:
    """Exact E[N_rej] of batch speculative decoding with M = ``drafts`` i.i.d. draft sequences.

    Design "B" (branching only at the round start; default) is Yin et al. 2024, Thm 3 (Alg. 4) in the
    derived form of docs/paper-notes.md, Yin §3.3: with the round-start measure f_1 = initial,
        f_{n+1}(y) = Σ_s f_n(s)·ρ_M(s)·r^M(y|s) + (μ_{n-1}(s) − f_n(s))·[target_n − draft_n]_+(s, y),
        E[N_rej] = Σ_n Σ_s [ f_n(s)·ρ_M(s) + (μ_{n-1}(s) − f_n(s))·TV_n(s) ]
                 = Thm 1 − Σ_n Σ_s f_n(s)·(TV_n(s) − ρ_M(s)),
    where μ_{n-1} is the target marginal of x_{n-1} (the output is unbiased) and ρ_M, r^M come from
    :func:`residual_chain`. M = 1 is Thm 1. Design B is the reconstruction consistent with Prop. 1.

    Design "A" (full prefix-tree DFS) is a DERIVED VARIANT, not the paper's Thm 3: its rejections
    keep falling toward 0 as M grows (when supp target ⊆ supp draft), which contradicts Prop. 1.
    Exact recursion over (state, number of surviving candidates); see ``_design_a_per_position``.
    Cost O(T·S²·M²). T = 0 gives 0 for both designs.
    """
    return float(batch_rejections_per_position(target=target, draft=draft, horizon=horizon, drafts=drafts,
                                               design=design).sum())


def batch_expected_target_calls(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None,
                                drafts: int, design: str = "B") -> float:
    """Exact E[number of target calls] of batch SD drafting to the horizon (Yin et al. 2024, Alg. 4 / Thm 3).

    One target call per round. As in Alg. 1 (:func:`expected_target_calls`), a round ends at its
    first rejection (every tested candidate rejected) or after accepting position T, and a rejection at
    t < T starts the next round at t + 1, so #calls = N_rej − R_T + 1 and

        E[#calls] = E[N_rej] + 1 − P(R_T = 1),

    where, for design B, P(R_T = 1) = Σ_s f_T(s)·ρ_M(s) + (μ_{T-1}(s) − f_T(s))·TV_T(s) is the last term
    of the Thm 3 f-recursion (:func:`batch_rejections_per_position`). Design "A" uses the same
    identity with our derived design-A recursion (a variant, not the paper's statement). T = 0 gives 0.
    """
    return _calls_from_per_position(batch_rejections_per_position(
        target=target, draft=draft, horizon=horizon, drafts=drafts, design=design))


def batch_improvement(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None,
                      drafts: int, design: str = "B") -> float:
    """Batch improvement E[N_rej^SD] − E[N_rej^batch] ≥ 0 (Yin et al. 2024, Thm 3; design B).

    For design B it is computed directly as Σ_n Σ_s f_n(s)·(TV_n(s) − ρ_M(s)) (no cancellation).
    Design "A" (derived variant, not the paper's statement) is the difference of the two exact values.
    T = 0 gives 0.
    """
    drafts = _check_drafts(drafts)
    if _check_design(design) == "B":
        return float(_batch_b_terms(target=target, draft=draft, horizon=horizon, drafts=drafts)[1].sum())
    return expected_rejections(target=target, draft=draft, horizon=horizon) - batch_expected_rejections(
        target=target, draft=draft, horizon=horizon, drafts=drafts, design=design)


def batch_rejections_limit(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None) -> float:
    """lim_{M→∞} E[N_rej^batch] under design B (Yin et al. 2024, Prop. 1).

    As M → ∞, ρ_M → target mass outside supp(draft) (0 when supp target ⊆ supp draft), so
        f_{n+1}^∞(y) = Σ_s f_n^∞(s)·target_n(y|s)·1[draft_n(y|s) = 0] + (μ_{n-1}(s) − f_n^∞(s))·[target_n − draft_n]_+(s, y)
    and the limit is Σ_n Σ_s [f_n^∞·ρ_∞ + (μ_{n-1} − f_n^∞)·TV_n], which stays > 0: only the first
    token of each round benefits from more drafts. T = 0 gives 0.
    """
    return float(_batch_b_terms(target=target, draft=draft, horizon=horizon, drafts=None)[0].sum())


def batch_target_calls_limit(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None) -> float:
    """lim_{M→∞} E[number of target calls] of batch SD, design B (Yin et al. 2024, Prop. 1 with the
    round count of :func:`batch_expected_target_calls`): E[N_rej^∞] + 1 − P^∞(R_T = 1). T = 0 gives 0."""
    return _calls_from_per_position(_batch_b_terms(target=target, draft=draft, horizon=horizon, drafts=None)[0])


def batch_round_starts(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None,
                       drafts: int | None) -> np.ndarray:
    """Round-start measure f_n(s) = P(x_{n-1} = s, a round starts at n), shaped (T, S), design B.

    Yin et al. 2024, Thm 3 / Prop. 1 (``drafts=None`` gives the M → ∞ measure f^∞). Shaped (0, S) for T = 0.
    """
    if drafts is not None:
        drafts = _check_drafts(drafts)
    return _batch_b_terms(target=target, draft=draft, horizon=horizon, drafts=drafts)[2]


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


def bernoulli_all_reject(*, target_p1, draft_p1, drafts):
    """ρ_M for target = Ber(c), draft = Ber(a): |c − a|·(1 − draft(x*))^{M−1} (Yin et al. 2024, Thm 3).

    ``target_p1`` = c and ``draft_p1`` = a are the probabilities of token 1. x* is the token where
    target > draft (x* = 1 if c > a, else 0); after the first rejection the residual is δ_{x*}.
    Broadcasts over its arguments. (Derived closed form, docs/paper-notes.md, Yin §3.3.)
    """
    a = _prob_array(draft_p1, "draft_p1")
    c = _prob_array(target_p1, "target_p1")
    m = _drafts_array(drafts)
    draft_at_star = np.where(c > a, a, 1.0 - a)
    return np.abs(c - a) * (1.0 - draft_at_star) ** (m - 1)


def bernoulli_batch_improvement(*, target_p1, draft_p1, drafts):
    """One-round-start batch improvement TV − ρ_M = |c − a|·(1 − (1 − draft(x*))^{M−1}) (Yin et al. 2024, Thm 3)."""
    a = _prob_array(draft_p1, "draft_p1")
    c = _prob_array(target_p1, "target_p1")
    return np.abs(c - a) - bernoulli_all_reject(target_p1=c, draft_p1=a, drafts=drafts)


def _uniform_sizes(target_support, draft_support):
    m_arr, k_arr = np.asarray(target_support), np.asarray(draft_support)
    for arr, name in ((m_arr, "target_support"), (k_arr, "draft_support")):
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 1):
            raise SpecboundError(f"{name} must be integer(s) >= 1, got {arr!r}")
    if np.any(m_arr > k_arr):
        raise SpecboundError(
            "the target's support must be a subset of the draft's (target_support <= draft_support)"
        )
    return m_arr, k_arr


def uniform_all_reject(*, target_support, draft_support, drafts):
    """ρ_M = (1 − m/k)^M for target uniform on m tokens, draft uniform on k ⊇ them (Yin et al. 2024, Thm 3).

    ``target_support`` = m, ``draft_support`` = k (as in docs/paper-notes.md, Yin §3.3). Every residual equals the
    target (uniform on its m tokens), so each candidate is rejected with probability TV = 1 − m/k
    independently. (Derived closed form, docs/paper-notes.md, Yin §3.3.)
    """
    m_arr, k_arr = _uniform_sizes(target_support, draft_support)
    return (1.0 - m_arr / k_arr) ** _drafts_array(drafts)


def uniform_batch_improvement(*, target_support, draft_support, drafts):
    """One-round-start batch improvement TV − ρ_M = (1 − m/k) − (1 − m/k)^M (Yin et al. 2024, Thm 3)."""
    m_arr, k_arr = _uniform_sizes(target_support, draft_support)
    return (1.0 - m_arr / k_arr) - uniform_all_reject(target_support=m_arr, draft_support=k_arr, drafts=drafts)


# ---------------------------------------------------------------------- Monte Carlo (pure NumPy)

def _categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One draw per row of ``probs`` (..., V) by inverse CDF."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[:-1])[..., None] * cdf[..., -1:]
    return (u >= cdf).sum(axis=-1).clip(max=probs.shape[-1] - 1)


def _rrs_residual_step(resid: np.ndarray, *, target_rows: np.ndarray, draft_rows: np.ndarray) -> np.ndarray:
    """r ← [r − draft]_+ / TV(draft, r): the residual update after a rejected candidate."""
    excess = np.clip(resid - draft_rows, 0.0, None)
    mass = excess.sum(-1, keepdims=True)
    return np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), resid)


def _simulate_batch(*, target: MarkovChain, draft: MarkovChain, horizon: int | None, drafts: int, design: str,
                    n_runs: int, rng: np.random.Generator, residual_step=_rrs_residual_step):
    """Vectorised simulation of Alg. 4; returns (rejections per run, paths x_0..x_T)."""
    horizon = _check_pair(target=target, draft=draft, horizon=horizon)
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
            resid[bad] = residual_step(resid[bad], target_rows=target_rows[bad], draft_rows=draft_rows[bad])
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


def simulate_batch_rejections(*, target: MarkovChain, draft: MarkovChain, horizon: int | None = None,
                              drafts: int, design: str = "B", n_runs: int = 10_000, seed=None,
                              return_paths: bool = False):
    """Monte Carlo of batch speculative decoding (Yin et al. 2024, Alg. 4 / Thm 3), pure NumPy.

    Each round draws ``drafts`` i.i.d. draft sequences up to the horizon from the accepted prefix;
    candidates are verified by recursive rejection sampling with residual updates, branching as in
    design "B" (only the accepted candidate continues after the round start; the reconstruction of
    Thm 3) or "A" (all candidates agreeing with the accepted prefix stay alive; a derived variant).
    ``drafts=1`` is Alg. 1 (Thm 1).

    Returns the number of rejections per run, shaped (n_runs,); with ``return_paths=True`` also the
    generated paths x_0..x_T, shaped (n_runs, T+1) (x_0 ~ target.initial), whose law is the target's.
    """
    drafts = _check_drafts(drafts)
    design = _check_design(design)
    if isinstance(n_runs, bool) or int(n_runs) < 1:
        raise SpecboundError(f"n_runs must be >= 1, got {n_runs}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    rejections, paths = _simulate_batch(target=target, draft=draft, horizon=horizon, drafts=drafts,
                                        design=design, n_runs=int(n_runs), rng=rng)
    return (rejections, paths) if return_paths else rejections


def sampled_tree_value(*, parents, tokens, target, draft) -> float:
    """Exact E[accepted drafted tokens | drafted tree] of a sampled draft tree verified by recursive
    rejection over the siblings at each node (Yin et al. 2024, Alg. 4 at every depth: batch design B;
    a chain is the tree of fan-out 1, where it is Σ_k Π_{i≤k} min(1, target_i/draft_i)).

    ``parents`` [n] (−1: a root child; parents before their children), ``tokens`` [n]; ``target`` and
    ``draft`` [n+1, V]: the processed laws at the root (row 0) and after node i (row i+1) — the
    target's, and the draft's that node i's children were sampled from (i.i.d.). The coins are
    integrated out: at a node with children x_1..x_m, child j is taken with probability
    Π_{l<j}(1 − a_l)·a_j, a_j = min(1, r^{j−1}(x_j)/draft(x_j)) with r the residual sequence of
    :func:`residual_chain`, and the walk goes on under it: V(u) = Σ_j P(j)·(1 + V(x_j))."""
    parents = np.asarray(parents, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    target, draft = np.asarray(target, dtype=np.float64), np.asarray(draft, dtype=np.float64)
    n = tokens.shape[0]
    if parents.shape != (n,) or target.ndim != 2 or target.shape != draft.shape or target.shape[0] != n + 1:
        raise SpecboundError(f"a drafted tree of n nodes needs parents [n], tokens [n] and target/draft laws [n+1, V]; "
                             f"got {parents.shape}, {tokens.shape}, {target.shape}, {draft.shape}")
    if n and (np.any(parents >= np.arange(n)) or np.any(parents < -1)):
        raise SpecboundError("parents must come before their children (parents[i] < i, −1 for the root's children)")
    children: list[list[int]] = [[] for _ in range(n + 1)]          # slot u + 1 holds node u's children
    for i, p in enumerate(parents.tolist()):
        children[p + 1].append(i)
    value = np.zeros(n + 1)                                          # value[u + 1] = V(u); value[0] = V(root)
    for u in range(n - 1, -2, -1):
        kids = children[u + 1]
        if not kids:
            continue
        # laws computed in float32 sum to 1 within ~1e-6: renormalised in float64 before the residual chain
        t_row, d_row = target[u + 1] / target[u + 1].sum(), draft[u + 1] / draft[u + 1].sum()
        residuals, _ = residual_chain(target=t_row, draft=d_row, drafts=len(kids))
        reach, v = 1.0, 0.0
        for j, kid in enumerate(kids):
            x = tokens[kid]
            q = d_row[x]
            a = min(1.0, residuals[j, x] / q) if q > 0 else 1.0      # as the engine: a token the draft cannot draw
            v += reach * a * (1.0 + value[kid + 1])
            reach *= 1.0 - a
        value[u + 1] = v
    return float(value[0])
