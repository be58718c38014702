"""How much to draft this round: ONE sizing rule for chains and trees (a chain is a tree of fan-out 1).

A drafted node's value is the probability that the target accepts the whole path to it; a round yields
1 + Σ_{v∈T} value(v) tokens (Pankratov & Alistarh 2026, §2). value(v) = value(parent) · c(q_v), with q_v
the draft's confidence in v's token and c an :class:`AcceptanceCalibration` learned online from the exact
conditional acceptance of the rule in use (the target's probability of the token for deterministic trees,
min(1, target/draft) token by token, P(τ ≥ i | τ ≥ i − 1) for a chain under block verification).

:class:`DraftBudget` grows a proposal while the marginal expected tokens per marginal second beat the
round's throughput E/T, T = draft seconds + t(pending + nodes) from the online-corrected
:class:`~specbound.decoding.costs.CostModel` (Yin et al.'s Assumption 1: free drafts, constant t). When
nothing pays the round is a plain step; after ``explore_every`` plain steps a probe draft is tried (backing
off while probes lose), so one bad estimate cannot keep decoding plain for good. :class:`BatchDraftLength`
(``batch_policy.py``) sizes batches, :class:`ShapeChoice` picks the shape; verification is untouched.
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecboundError
from .batch_policy import BatchDraftLength
from .costs import CostModel

__all__ = ["AcceptanceCalibration", "BatchDraftLength", "DraftBudget", "ShapeChoice"]


class AcceptanceCalibration:
    """c(q) = P(a drafted node is accepted | its parent was accepted), by draft-confidence bucket.

    Beta-smoothed bucket means: the prior of a bucket is its own mid-point (a calibrated draft) with
    weight ``prior_weight``; observations decay by ``memory`` per round so the estimate follows
    easy and hard stretches of text.
    """

    EDGES = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0 + 1e-9])

    def __init__(self, prior_weight: float = 2.0, memory: float = 0.98):
        mids = 0.5 * (self.EDGES[:-1] + self.EDGES[1:])
        self.prior_mean = np.clip(mids, 0.0, 1.0)
        self.prior_weight, self.memory = float(prior_weight), float(memory)
        self.sums = np.zeros(len(mids))
        self.counts = np.zeros(len(mids))

    def bucket(self, q) -> np.ndarray:
        q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
        return np.clip(np.searchsorted(self.EDGES, q, side="right") - 1, 0, len(self.prior_mean) - 1)

    def __call__(self, q) -> np.ndarray:
        b = self.bucket(q)
        w = self.prior_weight
        return (self.sums[b] + w * self.prior_mean[b]) / (self.counts[b] + w)

    def observe(self, q, accept_prob) -> None:
        """Record nodes with draft confidence ``q`` and exact conditional acceptance ``accept_prob``."""
        q, a = np.atleast_1d(np.asarray(q, np.float64)), np.atleast_1d(np.asarray(accept_prob, np.float64))
        keep = np.isfinite(q) & np.isfinite(a)
        if not keep.any():
            return
        self.sums *= self.memory
        self.counts *= self.memory
        np.add.at(self.sums, self.bucket(q[keep]), np.clip(a[keep], 0.0, 1.0))
        np.add.at(self.counts, self.bucket(q[keep]), 1.0)


class DraftBudget:
    """Grow a draft while it pays: add nodes when ΔE/ΔT > E/T (marginal tokens per second above the
    round's throughput so far). Shared by the chain drafter and the dynamic tree drafter."""

    def __init__(self, costs: CostModel, calibration: AcceptanceCalibration | None = None, max_nodes: int = 64,
                 max_depth: int = 32, explore_every: int = 4, lookahead: int = 4):
        if max_nodes < 1 or max_depth < 1:
            raise SpecboundError("max_nodes and max_depth must be >= 1")
        self.costs = costs
        self.calibration = calibration or AcceptanceCalibration()
        self.max_nodes, self.max_depth = int(max_nodes), int(max_depth)
        self.explore_every, self.lookahead = int(explore_every), int(lookahead)
        self.plain_run, self.gap, self.exploring = 0, self.explore_every, False
        self.probes = 0
        self.first_value = 0.7          # running mean of the calibrated value of a round's first node
        self.continuation = 0.7         # running mean of c(q) of the best child of an expanded node

    # ---------------------------------------------------------------- the rule
    def throughput(self, values_sum: float, draft_seconds: float, target_tokens: int) -> float:
        return (1.0 + values_sum) / (draft_seconds + self.costs.target(target_tokens))

    def worth_extending(self, values_sum: float, n_nodes: int, spent: float, pending: int,
                        gains: list[float], step_draft_seconds: list[float]) -> bool:
        """Would adding the candidate batches pay? ``gains[j]`` is the expected value added by the
        j-th further draft step and ``step_draft_seconds[j]`` its draft cost; any prefix of the
        steps may be taken (a lookahead over convex cost jumps)."""
        now = self.throughput(values_sum, spent, pending + n_nodes)
        added, seconds, nodes = 0.0, 0.0, 0
        for gain, cost in zip(gains, step_draft_seconds):
            added, seconds, nodes = added + gain, seconds + cost, nodes + 1
            if self.throughput(values_sum + added, spent + seconds, pending + n_nodes + nodes) > now:
                return True
        return False

    def best_prefix(self, values_desc: list[float], spent: float, pending: int) -> int:
        """How many of the nodes (sorted by value, best first) to send to the target: the prefix
        that maximises E/T given the draft time already spent."""
        best_n, best = 0, self.throughput(0.0, spent, pending)
        total = 0.0
        for n, v in enumerate(values_desc[:self.max_nodes], start=1):
            total += v
            rate = self.throughput(total, spent, pending + n)
            if rate > best:
                best_n, best = n, rate
        return best_n

    def predicted_chain_rate(self, limit: int) -> float:
        """The best tokens per second a model chain of at most ``limit`` tokens is predicted to give this
        round (values from the running first-node value and continuation; a plain step at worst)."""
        best, value, total, d1 = 1.0 / float(self.costs.target(1)), self.first_value, 0.0, float(self.costs.draft(1))
        for j in range(1, limit + 1):
            total += value
            best = max(best, self.throughput(total, d1 * j, 1 + j))
            value *= self.continuation
        return best

    # ---------------------------------------------------------------- round start
    def start(self, pending: int) -> bool:
        """Draft at all this round? Otherwise a plain target step. After ``gap`` plain steps in a row
        a probe round drafts anyway (:attr:`exploring`); the gap doubles while probes keep finding
        that drafting does not pay (up to 64) and resets once it pays again."""
        gains = [self.first_value * self.continuation ** j for j in range(self.lookahead)]
        costs = [self.costs.draft(pending)] + [self.costs.draft(1)] * (self.lookahead - 1)
        self.exploring = False
        if self.worth_extending(0.0, 0, 0.0, pending, gains, costs):
            self.plain_run, self.gap = 0, self.explore_every
            return True
        self.plain_run += 1
        if self.explore_every and self.plain_run >= self.gap:
            self.exploring, self.plain_run, self.gap = True, 0, min(2 * self.gap, 64)
            return True
        return False

    def probe_size(self) -> int:
        """Nodes an exploring round drafts: 2, 4, 8, 16, … in turn, so the run measures the cost
        curve where the prior may be wrong."""
        self.probes += 1
        return min(self.max_nodes, 2 ** (1 + (self.probes - 1) % 4))

    def learn(self, confidences, accept_probs, first_values=None, best_children=None) -> None:
        """Update the calibration with per-node (confidence, exact acceptance) pairs and the running
        means the round-start and continuation estimates use."""
        self.calibration.observe(confidences, accept_probs)
        if first_values is not None and len(first_values):
            self.first_value = 0.9 * self.first_value + 0.1 * float(np.max(first_values))
        if best_children is not None and len(best_children):
            self.continuation = 0.9 * self.continuation + 0.1 * float(np.mean(best_children))


class ShapeChoice:
    """Which drafted SHAPE a round uses (``shape="auto"``): the one with the highest predicted tokens
    per second, from what the shapes did on this text.

    Per shape s: E_s is the recency-weighted mean (weight ``memory`` per round of that shape) of
    1 + E[X | drafted tree] over its rounds — the exact expected accepted tokens GIVEN the tree it drafted
    (Pankratov & Alistarh 2026, §2; under recursive rejection :func:`specbound.theory.sampled_tree_value`,
    under block verification Σ_i P(τ ≥ i)), so the verifier's coins add no noise — and S_s the
    recency-weighted mean wall time of its rounds as measured (everything the choice changes). The rate
    is E_s / S_s. Schedule: the first shape alone for ``warmup`` rounds (the chain's calibration and length
    settle, and the other shapes are sized from it); then every other shape for ``trial`` rounds; then the
    best rate, a shape that lost retried after ``explore_every`` rounds, then 2, 4, 8, 16 times as long
    (reset when it wins). The choice depends only on rounds already verified, never on the round it sizes,
    so every round stays a lossless verification of the target's law.
    """

    def __init__(self, names, warmup: int = 4, trial: int = 2, explore_every: int = 8, memory: float = 0.9):
        names = list(names)
        if not names or len(set(names)) != len(names):
            raise SpecboundError(f"shape names must be distinct and at least one, got {names!r}")
        if warmup < 0 or trial < 1 or explore_every < 1 or not 0.0 < memory <= 1.0:
            raise SpecboundError("ShapeChoice needs warmup >= 0, trial >= 1, explore_every >= 1, 0 < memory <= 1")
        self.names = names
        self.warmup, self.trial, self.explore_every, self.memory = int(warmup), int(trial), int(explore_every), float(memory)
        self.round = 0
        self.tokens = dict.fromkeys(names, 0.0)     # recency-weighted sums per shape
        self.seconds = dict.fromkeys(names, 0.0)
        self.count = dict.fromkeys(names, 0)
        self.chosen = dict.fromkeys(names, 0)
        self.retries = dict.fromkeys(names, 0)
        self.next_try: dict[str, int] = {}

    def rate(self, name: str) -> float | None:
        """Predicted tokens per second of ``name`` (None before it has been timed)."""
        if self.count[name] == 0 or self.seconds[name] <= 0:
            return None
        return self.tokens[name] / self.seconds[name]

    def best(self) -> str:
        rated = [(self.rate(n), -i, n) for i, n in enumerate(self.names) if self.rate(n) is not None]
        return max(rated)[2] if rated else self.names[0]

    def choose(self) -> str:
        """The shape of the next round."""
        self.round += 1
        name = self._choose()
        self.chosen[name] += 1
        return name

    def _choose(self) -> str:
        if self.round <= self.warmup or len(self.names) == 1:
            return self.names[0]
        untried = [n for n in self.names if self.count[n] < self.trial]
        if untried:
            return untried[0]
        best = self.best()
        self.retries[best] = 0
        for name in self.names:
            if name == best:
                continue
            due = self.next_try.setdefault(name, self.round + self.explore_every)
            if self.round >= due:
                self.retries[name] += 1
                self.next_try[name] = self.round + self.explore_every * 2 ** min(self.retries[name], 4)
                return name
        return best

    def record(self, name: str, tokens: float, seconds: float) -> None:
        """One round of ``name``: ``tokens`` = 1 + E[X | its drafted tree], ``seconds`` its wall time."""
        if not (np.isfinite(tokens) and np.isfinite(seconds)) or seconds <= 0:
            return
        m = self.memory
        self.tokens[name] = m * self.tokens[name] + float(tokens)
        self.seconds[name] = m * self.seconds[name] + float(seconds)
        self.count[name] += 1
