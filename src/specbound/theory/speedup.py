"""Cost model of speculative decoding: tokens per step, wall-clock speed-up, best draft length.

Pure NumPy. Acceptance is either one rate α (i.i.d. positions, Leviathan et al. 2023) or a
positional vector α_i = P(position i accepted | positions < i accepted). Costs are measured, not
assumed: ``verify_cost(k)`` is the target's time to read k new tokens in one pass (on CPUs this is
far from constant in k), ``draft_cost`` the draft's time per drafted token. Yin et al.'s
Assumption 1 (free drafts, O(1) verification) is the special case draft_cost = 0, t(k) = t(1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SpecboundError

__all__ = [
    "CostProfile",
    "best_free_prefix",
    "priced_draft_seconds",
    "accepted_run_lengths",
    "allocate_batch_nodes",
    "batch_throughput",
    "rows_pass_seconds",
    "best_batch_gamma",
    "shared_pass_throughput",
    "best_gamma",
    "chain_draft_seconds",
    "chain_full_acceptance",
    "expected_speedup",
    "expected_tokens_per_step",
    "greedy_chain_full_rounds",
    "greedy_chain_rounds",
    "perfect_draft_throughput",
    "round_speedup",
    "speed_of_light_speedup",
]


@dataclass(frozen=True)
class CostProfile:
    """Measured seconds for a forward reading k new tokens, at the measured ks; linear in between."""

    ks: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        if len(self.ks) == 0 or len(self.ks) != len(self.seconds):
            raise SpecboundError("CostProfile needs matching, non-empty ks and seconds")
        if list(self.ks) != sorted(set(self.ks)) or self.ks[0] < 1:
            raise SpecboundError(f"CostProfile ks must be increasing integers >= 1, got {self.ks}")
        if any(not np.isfinite(s) or s <= 0 for s in self.seconds):
            raise SpecboundError("CostProfile seconds must be finite and > 0")

    @classmethod
    def constant(cls, seconds: float = 1.0) -> "CostProfile":
        """Assumption 1 of Yin et al.: one pass costs the same for any number of tokens."""
        return cls((1,), (float(seconds),))

    def __call__(self, k) -> np.ndarray:
        """t(k), interpolated linearly and extrapolated with the last measured slope (never a falling
        one: a noisy last point must not make reading more tokens cost less, or nothing)."""
        k = np.asarray(k, dtype=np.float64)
        ks, ts = np.asarray(self.ks, float), np.asarray(self.seconds, float)
        if len(ks) == 1:
            return np.full_like(k, ts[0])
        out = np.interp(k, ks, ts)
        slope = max((ts[-1] - ts[-2]) / (ks[-1] - ks[-2]), 0.0)
        return np.where(k > ks[-1], ts[-1] + slope * (k - ks[-1]), out)

    def ratios(self) -> dict[int, float]:
        """t(k)/t(1) at the measured ks."""
        base = float(self(1))
        return {int(k): float(s) / base for k, s in zip(self.ks, self.seconds)}


def _acceptance_vector(alpha, gamma: int) -> np.ndarray:
    alpha = np.asarray(alpha, dtype=np.float64)
    if np.any(alpha < 0) or np.any(alpha > 1) or not np.all(np.isfinite(alpha)):
        raise SpecboundError("acceptance rates must lie in [0, 1]")
    if alpha.ndim == 0:
        return np.full(gamma, float(alpha))
    if len(alpha) < gamma:      # positions beyond the measured ones reuse the last rate
        alpha = np.concatenate([alpha, np.full(gamma - len(alpha), alpha[-1] if len(alpha) else 0.0)])
    return alpha[:gamma]


def expected_tokens_per_step(alpha, gamma: int) -> float:
    """E[tokens per target call] for a draft of length γ: 1 + Σ_{i=1}^γ Π_{j≤i} α_j.

    With one rate α this is (1 − α^{γ+1})/(1 − α) (Leviathan et al. 2023, Eq. 1). The +1 is the
    recovered or bonus token every round produces; γ = 0 is plain decoding (1 token per call).
    """
    if gamma < 0:
        raise SpecboundError(f"gamma must be >= 0, got {gamma}")
    return float(1.0 + np.cumprod(_acceptance_vector(alpha, gamma)).sum())


def accepted_run_lengths(matches) -> np.ndarray:
    """L_j = number of consecutive drafted tokens a greedy chain starting at position j gets accepted:
    the run of True in ``matches`` (draft arg-max == target token, position by position) from j on."""
    m = np.asarray(matches, dtype=bool)
    runs = np.zeros(len(m) + 1, dtype=np.int64)
    for j in range(len(m) - 1, -1, -1):
        runs[j] = runs[j + 1] + 1 if m[j] else 0
    return runs[:-1]


def chain_full_acceptance(alpha, gamma: int) -> float:
    """P(all γ drafted tokens of a chain accepted) = Π_{i≤γ} α_i (positional acceptance α_i, the last
    measured rate reused beyond the measured positions, as :func:`expected_tokens_per_step`)."""
    if gamma < 0:
        raise SpecboundError(f"gamma must be >= 0, got {gamma}")
    return float(np.prod(_acceptance_vector(alpha, gamma)))


def chain_draft_seconds(gamma: int, read_seconds: float, catch_up_seconds: float, full_rate: float) -> float:
    """Seconds of the draft's reads in one round of a chain of γ, as the engine makes them: γ reads of
    one token (the draft feeds each drafted token to propose the next), except that after a round whose
    γ tokens were all accepted the next round's first read takes two — the last drafted token, never fed,
    and the bonus token — where after a rejection it takes one (the recovered token). With a fraction
    ``full_rate`` of fully accepted rounds (:func:`chain_full_acceptance`, or counted along greedy texts by
    :func:`greedy_chain_full_rounds`), a round costs on average

        γ · read + full_rate · catch_up,   catch_up = d(2) − d(1).

    Short chains are accepted whole more often, so they pay it more often (γ = 2 on GSM8K: ~3 rounds in 4)."""
    if gamma < 0 or read_seconds < 0 or catch_up_seconds < 0 or not 0.0 <= full_rate <= 1.0:
        raise SpecboundError(f"chain_draft_seconds needs γ, seconds >= 0 and a rate in [0, 1], got "
                             f"{gamma}, {read_seconds}, {catch_up_seconds}, {full_rate}")
    return float(gamma * read_seconds + (full_rate * catch_up_seconds if gamma > 0 else 0.0))


def _greedy_chain_walk(matches, gamma: int):
    """The accepted drafted tokens of each round of a greedy chain of γ along one text (see
    :func:`greedy_chain_rounds`)."""
    if gamma < 0:
        raise SpecboundError(f"gamma must be >= 0, got {gamma}")
    runs = accepted_run_lengths(matches)
    pos = 0
    while pos < len(runs):
        accepted = min(int(runs[pos]), gamma)
        yield accepted
        pos += accepted + 1


def greedy_chain_full_rounds(matches, gamma: int) -> int:
    """How many rounds of :func:`greedy_chain_rounds` accept all γ drafted tokens (γ ≥ 1)."""
    return sum(1 for accepted in _greedy_chain_walk(matches, gamma) if gamma > 0 and accepted == gamma)


def greedy_chain_rounds(matches, gamma: int) -> tuple[int, int]:
    """(rounds, tokens) of greedy chain SD with a fixed draft length γ along one text (renewal-reward).

    At greedy both models are deterministic, so whether the draft's arg-max equals the target's
    token is a fixed property of each position (``matches``, read with one teacher-forced draft
    pass over the target's own greedy text). A round starting at position j commits
    min(L_j, γ) drafted tokens plus one recovered or bonus token; the next round starts after
    them. Averaging over round starts, not over positions, is what makes bursty acceptance (long
    runs on code) count as it does in a real run: a per-position acceptance rate α_i multiplied
    into Π α_i (:func:`expected_tokens_per_step`) assumes the positions independent and
    misprices long chains."""
    rounds = sum(1 for _ in _greedy_chain_walk(matches, gamma))
    return rounds, len(matches)


def step_seconds(gamma: int, draft_cost: float, verify_cost: CostProfile) -> float:
    """Wall-clock of one round: γ draft forwards + one target pass over γ+1 tokens."""
    return float(gamma * draft_cost + verify_cost(gamma + 1))


def expected_speedup(alpha, gamma: int, draft_cost: float, verify_cost: CostProfile) -> float:
    """Predicted speed-up over target autoregressive decoding (t(1) per token).

    speed-up(γ) = E[tokens per step](α, γ) · t(1) / (γ · c_draft + t(γ + 1)).
    With one rate α and t(k) = t(1) this is Leviathan et al. 2023's improvement factor
    (1 − α^{γ+1}) / ((1 − α)(γc + 1)), c = c_draft / t(1); Yin et al. 2024's Assumption 1 is c = 0.
    """
    if draft_cost < 0:
        raise SpecboundError("draft_cost must be >= 0")
    return expected_tokens_per_step(alpha, gamma) * float(verify_cost(1)) / step_seconds(gamma, draft_cost, verify_cost)


def best_gamma(alpha, draft_cost: float, verify_cost: CostProfile, max_gamma: int = 16,
               min_gain: float = 1.0) -> tuple[int, float]:
    """The draft length with the largest predicted speed-up; γ = 0 (plain decoding) unless some
    γ ≥ 1 beats it by the factor ``min_gain``. Returns (γ, predicted speed-up).

    Maximises :func:`expected_speedup` over γ, as Leviathan et al. 2023 choose γ from their
    improvement factor, here with measured costs.
    """
    if max_gamma < 0:
        raise SpecboundError("max_gamma must be >= 0")
    gains = [expected_speedup(alpha, g, draft_cost, verify_cost) for g in range(max_gamma + 1)]
    g = int(np.argmax(gains))
    if g > 0 and gains[g] < min_gain:
        return 0, gains[0]
    return g, gains[g]


def round_speedup(expected_accepted, draft_seconds, verify_cost: CostProfile, verified_tokens) -> np.ndarray:
    """Speed-up of rounds that yield 1 + E[X] tokens for ``draft_seconds`` of drafting plus one target
    pass over ``verified_tokens`` tokens, against plain decoding at t(1) per token:

        speed-up = (1 + E[X]) · t(1) / (draft seconds + t(verified tokens)).

    E[X] is the tree value Σ_{v∈T} p_target(v) of the drafted tree (Pankratov & Alistarh 2026, §2;
    for a chain with positional acceptance α, Σ_i Π_{j≤i} α_j, Leviathan et al. 2023). With free
    drafting and t(k) = t(1) (Yin et al. 2024, Assumption 1) it is 1 + E[X]. Broadcasts over arrays.
    """
    x = np.asarray(expected_accepted, dtype=np.float64)
    d = np.asarray(draft_seconds, dtype=np.float64)
    if np.any(x < 0) or np.any(d < 0):
        raise SpecboundError("expected accepted tokens and draft seconds must be >= 0")
    return (1.0 + x) * float(verify_cost(1)) / (d + verify_cost(np.asarray(verified_tokens)))


def speed_of_light_speedup(expected_accepted_by_capacity: dict[int, float], verify_cost: CostProfile) -> tuple[int, float]:
    """The best capacity P and its speed-up with free drafting: max_P (1 + E[X](P))·t(1)/t(P + 1), with
    E[X](P) the optimal tree's value E[X | T*(P)] (or an upper bound on it) and the measured t(k)."""
    if not expected_accepted_by_capacity:
        raise SpecboundError("speed_of_light_speedup needs at least one capacity")
    best = max(expected_accepted_by_capacity,
               key=lambda P: float(round_speedup(expected_accepted_by_capacity[P], 0.0, verify_cost, P + 1)))
    return int(best), float(round_speedup(expected_accepted_by_capacity[best], 0.0, verify_cost, best + 1))


# ------------------------------------------------------------------------------------------ batches
def rows_pass_seconds(cost: CostProfile, rows, tokens_per_row=1, shared: bool = True) -> np.ndarray:
    """Seconds of one batch pass over ``rows`` rows of ``tokens_per_row`` tokens each: c(rows · k) when
    the rows share ONE forward (one weight read for all of them: torch rows, ``models/static.py``),
    rows · c(k) when they run one after another (backends whose rows cannot share a forward)."""
    rows = np.asarray(rows, dtype=np.float64)
    k = np.asarray(tokens_per_row, dtype=np.float64)
    return cost(rows * k) if shared else rows * cost(k)


def batch_throughput(alpha, gamma: int, batch: int, draft_cost: CostProfile, verify_cost: CostProfile,
                     round_overhead: tuple[float, float, float] = (0.0, 0.0, 0.0),
                     draft_rows_shared: bool = True, verify_rows_shared: bool = True) -> float:
    """Total tokens per second of ``batch`` requests decoded together, each drafting a chain of γ
    (acceptance α per depth) every round: B · E[tokens per round](α, γ) / (γ · d_B + t(B·(γ + 1)) + w(γ)).

    Every target pass reads all B requests' γ + 1 tokens (one shared pass, cost t(B(γ+1)); B · t(γ + 1)
    when the target's rows run in turn, ``verify_rows_shared``); every draft depth is one draft pass
    over the B rows' next tokens, d_B = d(B) when the draft's rows share it and B · d(1) when they run
    in turn (``draft_rows_shared``, :func:`rows_pass_seconds`). γ = 0 is plain batched decoding,
    B / t(B). The tokens per round are Leviathan et al. 2023's 1 + Σ_i Π_{j≤i} α_j
    (:func:`expected_tokens_per_step`); symmetric requests are assumed (docs/design.md, batched requests).
    ``round_overhead`` (w_plain, c₀, c₁): seconds per round outside the passes (sampling, verification
    and scheduling of the B rows): w(0) = w_plain for a plain round, w(γ) = c₀ + c₁·γ for a drafted
    one; zero by default (the passes alone).
    """
    batch = int(batch)
    if batch < 1:
        raise SpecboundError(f"batch must be >= 1, got {batch}")
    plain, c0, c1 = (float(c) for c in round_overhead)
    if min(plain, c0, c1) < 0:
        raise SpecboundError(f"round_overhead must be >= 0, got {round_overhead}")
    work = c0 + c1 * gamma if gamma > 0 else plain
    draft = float(rows_pass_seconds(draft_cost, batch, 1, draft_rows_shared))
    verify = float(rows_pass_seconds(verify_cost, batch, gamma + 1, verify_rows_shared))
    seconds = gamma * draft + verify + work
    return batch * expected_tokens_per_step(alpha, gamma) / seconds


def shared_pass_throughput(tokens_per_round, batch: int, draft_seconds, tokens_read_per_request,
                           verify_cost: CostProfile, verify_scale: float = 1.0, work=0.0) -> np.ndarray:
    """Total tokens per second of ``batch`` symmetric requests that each yield ``tokens_per_round``
    (1 + E[X]) per round, drafting for ``draft_seconds`` (the batch's shared draft passes) and having
    the target read ``tokens_read_per_request`` tokens each in ONE shared pass:
    B · (1 + E[X]) / (draft seconds + s · t(B · tokens read) + w). ``verify_scale`` s: measured / predicted
    seconds of the batch's target passes (B rows each attend over a cache of their own, so a pass over
    B rows costs more than one row reading as many tokens); ``work`` w: seconds per round outside the
    passes (the requests' sampling, verification and scheduling). Broadcasts; :func:`batch_throughput`
    is the chain case with positional acceptance α."""
    batch = int(batch)
    if batch < 1:
        raise SpecboundError(f"batch must be >= 1, got {batch}")
    if not (verify_scale > 0) or np.any(np.asarray(work) < 0):
        raise SpecboundError(f"verify_scale must be > 0 and work >= 0, got {verify_scale}, {work}")
    tokens = np.asarray(tokens_per_round, dtype=np.float64)
    return batch * tokens / (np.asarray(draft_seconds, dtype=np.float64)
                             + verify_scale * verify_cost(batch * np.asarray(tokens_read_per_request))
                             + np.asarray(work, dtype=np.float64))


def perfect_draft_throughput(batch: int, draft_round_seconds, verify_cost: CostProfile, verify_scale: float = 1.0,
                             work: float = 0.0) -> tuple[int, float]:
    """The most total tokens per second that drafting at THIS draft's cost can give B requests: every
    drafted token accepted (acceptance 1, the draft never wrong), so a chain of γ yields γ + 1 tokens per
    request and round,

        max over γ ≥ 1 of  B · (γ + 1) / (D(γ) + s · t(B · (γ + 1)) + w),

    with D(γ) = ``draft_round_seconds[γ − 1]`` the seconds of a round's draft passes at depth γ, s the
    target passes' measured/predicted ratio (``verify_scale``) and w the round's work outside the passes.
    Returns (γ, tokens/s), or (0, plain B / (s · t(B) + w)) when no γ beats plain rounds.

    It bounds every drafter of this cost, not only chains: a round yields at most depth + 1 tokens per
    request (Pankratov & Alistarh 2026, E[X | T] ≤ depth(T)) and a tree of depth D costs at least the
    chain of γ = D (D draft passes, a target pass over ≥ D + 1 tokens, t non-decreasing). Where it is at
    most plain throughput no drafter of this cost pays at this B; :func:`speed_of_light_speedup` (free
    drafting, the target's own acceptance) bounds a drafter too.
    """
    batch = int(batch)
    if batch < 1:
        raise SpecboundError(f"batch must be >= 1, got {batch}")
    d = np.asarray(draft_round_seconds, dtype=np.float64).reshape(-1)
    if d.size == 0 or np.any(~np.isfinite(d)) or np.any(d < 0):
        raise SpecboundError("draft_round_seconds must be a non-empty list of finite seconds >= 0, for γ = 1, 2, …")
    plain = float(shared_pass_throughput(1.0, batch, 0.0, 1, verify_cost, verify_scale, work))
    gammas = np.arange(1, d.size + 1, dtype=np.float64)
    rates = shared_pass_throughput(gammas + 1.0, batch, d, gammas + 1.0, verify_cost, verify_scale, work)
    g = int(np.argmax(rates))
    return (g + 1, float(rates[g])) if rates[g] > plain else (0, plain)


def best_batch_gamma(alpha, batch: int, draft_cost: CostProfile, verify_cost: CostProfile,
                     max_gamma: int = 16,
                     round_overhead: tuple[float, float, float] = (0.0, 0.0, 0.0),
                     draft_rows_shared: bool = True, verify_rows_shared: bool = True) -> tuple[int, float]:
    """The chain length γ (0 = plain batched decoding) with the largest :func:`batch_throughput` at
    batch size B, and that throughput: the row a per-batch-size table of draft lengths holds."""
    if max_gamma < 0:
        raise SpecboundError("max_gamma must be >= 0")
    rates = [batch_throughput(alpha, g, batch, draft_cost, verify_cost, round_overhead, draft_rows_shared,
                              verify_rows_shared) for g in range(max_gamma + 1)]
    g = int(np.argmax(rates))
    return g, float(rates[g])


def allocate_batch_nodes(values, verify_cost: CostProfile, pending=None,
                         draft_seconds_per_node: float = 0.0) -> tuple[list[int], float]:
    """Share one target pass among B requests: how many drafted nodes each request sends this round.

    ``values[b]`` are request b's candidate nodes' values in the order it would add them, each the
    probability that the node is accepted (the path probability of a chain position or tree node,
    Pankratov & Alistarh 2026, §2: a tree's E[X] is the sum of its nodes' values), non-increasing.
    Giving request b its first n_b nodes yields Σ_b (1 + Σ_{j<n_b} values[b][j]) tokens for one pass
    over Σ_b (pending_b + n_b) tokens (``pending``: tokens each request must read anyway, default 1)
    plus ``draft_seconds_per_node`` per node. For a fixed total N the sum of values is largest for the
    N largest values over all requests (a prefix of each request, the values being non-increasing), so
    the optimum is found by ranking all candidates best-first and choosing N: the allocation that
    maximises tokens per second for this model (tested against brute force, tests/test_batched_theory.py).
    Returns (n_b per request, tokens per second); a request may get 0 nodes.
    """
    rows = [np.asarray(v, dtype=np.float64).ravel() for v in values]
    if not rows:
        raise SpecboundError("allocate_batch_nodes needs at least one request")
    for b, v in enumerate(rows):
        if np.any(~np.isfinite(v)) or np.any(v < 0) or np.any(v > 1):
            raise SpecboundError(f"request {b}: node values must be probabilities in [0, 1]")
        if np.any(np.diff(v) > 1e-12):
            raise SpecboundError(f"request {b}: node values must be non-increasing (best-first order)")
    if draft_seconds_per_node < 0:
        raise SpecboundError("draft_seconds_per_node must be >= 0")
    pending = [1] * len(rows) if pending is None else [int(p) for p in pending]
    if len(pending) != len(rows) or min(pending) < 0:
        raise SpecboundError("pending must give a count >= 0 for every request")
    ranked = sorted(((float(v[j]), b, j) for b, v in enumerate(rows) for j in range(len(v))),
                    key=lambda c: (-c[0], c[2], c[1]))
    base_tokens, base_read = float(len(rows)), sum(pending)
    best_n, best_rate, gained = 0, base_tokens / float(verify_cost(base_read)), 0.0
    for n, (value, _, _) in enumerate(ranked, start=1):
        gained += value
        rate = (base_tokens + gained) / (float(verify_cost(base_read + n)) + n * draft_seconds_per_node)
        if rate > best_rate:
            best_n, best_rate = n, rate
    counts = [0] * len(rows)
    for _, b, _ in ranked[:best_n]:
        counts[b] += 1
    return counts, float(best_rate)


def priced_draft_seconds(draft_token_seconds: float, max_gamma: int, context_share: float = 0.0) -> np.ndarray:
    """D(γ), γ = 1..``max_gamma``, of a chain whose drafted tokens are priced by where they come from: a
    share ``context_share`` found in the context (no draft read, ≈ 0 s) and the rest read by the draft
    model at ``draft_token_seconds`` each — D(γ) = γ (1 − share) d(1). What
    :func:`perfect_draft_throughput` takes to bound a mixed drafter (context and model tokens)."""
    if not 0.0 <= context_share <= 1.0:
        raise SpecboundError(f"context_share must be in [0, 1], got {context_share}")
    if max_gamma < 1 or not math.isfinite(draft_token_seconds) or draft_token_seconds < 0:
        raise SpecboundError("max_gamma must be >= 1 and draft_token_seconds finite >= 0")
    return np.arange(1, int(max_gamma) + 1, dtype=np.float64) * (1.0 - context_share) * float(draft_token_seconds)


def best_free_prefix(rates, verify_seconds, fixed_seconds: float = 0.0) -> tuple[int, float]:
    """The prefix j of a proposal that costs no draft reads (tokens found in the context), with per-depth
    acceptance ``rates`` (each given its prefix), that maximises the expected tokens per second of its
    round, (1 + Σ_{i≤j} Π_{l≤i} r_l) / (fixed + t(j + 1)), ``verify_seconds(k)``
    the target's pass over k tokens; returns (j, that rate); j = 0 is a plain step."""
    best, value, expected = (0, 1.0 / (fixed_seconds + float(verify_seconds(1)))), 1.0, 1.0
    for j, r in enumerate(rates, start=1):
        value *= r
        expected += value
        rate = expected / (fixed_seconds + float(verify_seconds(j + 1)))
        if rate > best[1]:
            best = (j, rate)
    return best
