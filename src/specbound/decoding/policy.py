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
sizes batches, :class:`ShapeChoice` picks the shape. Sizing never changes verification: the law is untouched.
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecboundError
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


class BatchDraftLength:
    """``gamma="auto"`` for B requests decoded together: ONE chain length per round for every request.

    A round lasts as long as its longest draft, so ragged per-request lengths pay for draft passes that
    hold one or two rows (measured: they lost to a fixed γ). γ* maximises the predicted total throughput
    (:func:`~specbound.theory.speedup.best_batch_gamma`) from the per-depth acceptance pooled over the
    requests (:meth:`alpha`), the cost curves priced by the batch's own passes (``passes``: the scheduler's
    records; ``live``: requests still decoding; c(B·k) for rows sharing a pass, B·c(k) for rows read in
    turn, ``rows_shared``) and each round's work outside the passes (:meth:`round_overhead`). A batch starts
    drafting only where that repays the draft rows' backlog (``outlook``, priced at the acceptance ``shown``
    in earlier runs: :meth:`worth_starting`), probes the depth beyond γ* (:meth:`_probe_deeper`) and checks
    γ* against timed plain rounds (``trial`` rounds each, re-tried after ``explore_every``, then 2, 4, 8, 16
    times as long). With ``per_request`` (rows read in turn) each request sizes its own chain under the
    model's limit (:meth:`_break_even`). A round's γ is fixed when its first request asks; sizing never
    changes verification. The measurements behind each rule: docs/results/HISTORY.md (the batch policy).
    """

    def __init__(self, costs, passes=None, live=None, max_gamma: int = 8, start: int = 2, explore_every: int = 16,
                 trial: int = 2, window: int = 8, rows_shared: tuple[bool, bool] = (True, True),
                 per_request: bool = False, recheck: int = 8, probe_margin: float = 1.0, outlook=None,
                 shown=None):
        import threading

        self.costs, self.passes, self.live = costs, passes, live or (lambda: 1)
        self.draft_shared, self.verify_shared = (bool(x) for x in rows_shared)
        self.per_request = bool(per_request)
        self.max_gamma, self.start, self.explore_every = int(max_gamma), int(start), int(explore_every)
        self.trial, self.window = int(trial), int(window)
        self.hits = np.zeros(self.max_gamma)         # accepted / tested drafts per depth, as observed
        self.tries = np.zeros(self.max_gamma)
        self.observed = np.zeros(self.max_gamma)
        self.confidence_sum, self.confidence_count = 0.0, 0   # the draft's own confidence in its greedy tokens
        self._gammas: dict[int, int] = {}
        self._started: dict[int, float] = {}
        self._tokens: dict[int, float] = {}
        self._live_at: dict[int, int] = {}
        self._depth: dict[int, int] = {}             # the longest chain drafted in a round (per_request)
        self.rounds: dict[int, list[tuple[int, float, int]]] = {}   # γ -> [(round, seconds, live requests)] timed
        self._deciding = 0                           # the round whose γ was decided last
        self._hold: tuple[int, int] | None = None    # (γ, last round) of a re-try in progress
        self._probes = 0
        # per_request: drafting is probed at the second round (the first reads the prompts) — under the prior
        # (½ per depth) the model rarely drafts, and waiting ``explore_every`` plain rounds for the first look
        # at what the requests accept cost a quarter of a 64-token run at 2 requests (dev, HumanEval 58-61)
        self._next_probe = 2 if self.per_request else self.explore_every
        self._pass_at: dict[int, int] = {}          # the scheduler's pass count when a round began
        self._work: list[tuple[int, float, int]] = []   # (depth, seconds outside the passes, live) per timed round
        self.recheck = max(int(recheck), 1)
        # per_request: probe only where drafting, fully accepted, would beat plain rounds by more than this. A
        # probe's draft rows read their prompts (a one-time cost); but the ceiling is priced with the cost
        # prior before any draft pass was timed, and a margin of 1.2 kept a dev batch of 2 from ever drafting
        # on a stale prior (fixed γ = 6 measured 1.36x there), so the default stays 1.0
        self.probe_margin = float(probe_margin)
        # outlook() -> (tokens the live requests may still decode, committed tokens their draft rows have not
        # read): what starting to draft after plain rounds can win and what it costs first (None: not priced)
        self.outlook = outlook
        # the pair's per-depth acceptance shown in earlier runs (acceptance.ShownAcceptance.per_depth), what the
        # start is priced at before this batch has drafted; None: full acceptance, an upper bound
        self.shown = None if shown is None else np.asarray(shown, dtype=np.float64)[:self.max_gamma]
        # starting needs twice the backlog's read: the saving is a prediction (at full acceptance, where the
        # pair has shown none, an upper bound: at ~0.9 per depth, as on code, a chain of 8 keeps about half of
        # it), and the model over-rated drafting at 4 requests by 10-20% (int8 target, GSM8K 133-140: γ = 4
        # predicted 1.11x at 0.9 per depth, measured 0.92-1.04x). With 1.0, a batch of 8 whose bound saved
        # about the draft's prefill started drafting on the noise of the target's measured passes and decoded
        # at 0.57x plain (dev, HumanEval 58-65)
        self.start_margin = 2.0
        self.switch_margin = 0.05
        self._payback: tuple[int, bool] | None = None  # (round, answer) of the last worth_starting check
        self._ratio_memo: dict = {}                  # (priority, curve, shared) -> (passes seen, ratio)
        self._learned = 0                            # drafted rounds observed (the acceptance changed)
        self._plain_since: tuple[int, int, int] | None = None   # (round, live, learned) of the model's last "plain"
        self._lock = threading.Lock()

    #: weight (in observations) of the all-depth acceptance in each depth's estimate
    shrinkage = 2.0

    def alpha(self) -> np.ndarray:
        """Acceptance per depth, pooled over the requests: (hits_i + s·ā) / (tries_i + s), shrunk toward
        ā, the acceptance over ALL depths, with weight s = ``shrinkage``; a depth never tested gets ā. Why not
        a flat prior per depth: a depth tested once or twice sat near ½ however well the shallower depths
        accepted, so long chains were priced as losing, and short chains never test deep depths.
        """
        from .acceptance import shrunk_acceptance

        return shrunk_acceptance(self.hits, self.tries, self._pooled(), self.shrinkage)

    #: weight (in observations) of the draft's mean confidence as the prior of the pooled acceptance
    confidence_weight = 8.0

    def _pooled(self) -> float:
        """The acceptance over all depths' tests, under a Beta prior centred on the draft's mean confidence
        in the tokens it drafted greedily so far (the soft-max of its arg-max), with weight
        ``confidence_weight``; without confidences (sampled chains) Beta(1, 1). Why: the first rounds test a
        handful of tokens, and a prior of ½ held the pooled acceptance far below code's ~0.9 for a dozen
        rounds; on this pair the draft's mean confidence is close to the agreement it predicts.
        """
        if self.confidence_count:
            mean, weight = self.confidence_sum / self.confidence_count, self.confidence_weight
        else:
            mean, weight = 0.5, 2.0
        return float((self.hits.sum() + weight * mean) / (self.tries.sum() + weight))

    def _ratio(self, priority: int, curve, shared: bool) -> float:
        from .costs import pass_ratios

        records = self.passes() if self.passes is not None else []
        key, seen = (priority, id(curve), shared), len(records)   # one decision reads a ratio up to three times
        cached = self._ratio_memo.get(key)
        if cached is not None and cached[0] == seen:
            return cached[1]
        recent = records[-64:]
        # a round's passes read at most max_gamma + 1 tokens per row (the first draft read of a round: the
        # bonus token too); longer ones are prompts or backlogs, whose cost per token is no guide to a round's
        ratios = pass_ratios([p for p in recent if p.priority == priority and p.tokens <= (self.max_gamma + 2) * p.rows],
                             curve, shared)
        ratio = float(np.median(ratios)) if ratios else 1.0
        self._ratio_memo[key] = (seen, ratio)
        return ratio

    def model_gamma(self) -> int:
        """The cost model's γ* for the batch as it is now (no timing of rounds). With ``per_request``:
        the limit under which each request's own budget sizes its chain (:meth:`_break_even`, 0 = a
        plain round); the first round is priced with the prior acceptance (½ per depth) instead of
        drafting ``start`` tokens."""
        from ..theory.speedup import best_batch_gamma

        if not self.observed.any() and not self.per_request:
            return self.start
        live = max(int(self.live()), 1)
        draft, verify = self._scaled_costs() if self.per_request else self._round_costs(live)
        overhead = self.round_overhead(live, draft, verify)
        if self.per_request:
            return self._break_even(live, draft, verify, overhead)
        gamma, rate = best_batch_gamma(self.alpha(), live, draft, verify, self.max_gamma, overhead, self.draft_shared,
                                       self.verify_shared)
        return self._probe_deeper(gamma, rate, live, draft, verify, overhead)

    #: tries a depth gets before its own acceptance may keep chains short of it (:meth:`_probe_deeper`)
    min_tries = 8
    #: how far below γ*'s predicted rate the next depth may be and still be probed: the model's error.
    #: With 0 (probe only where predicted faster), a pass size never read is priced at the curve and
    #: predicted within 0.3% of γ* = 2 for 18 rounds; read, it was 7% faster (int8 target, 2 requests,
    #: HumanEval 134-135: γ = 2 until round 23, then 4)
    probe_tolerance = 0.05

    def _probe_deeper(self, gamma: int, rate: float, live: int, draft, verify, overhead) -> int:
        """γ* + 1 instead of the model's γ* ≥ 1 while depth γ* + 1 has had fewer than ``min_tries`` tries and
        would pay at the acceptance over all depths (its prior), within ``probe_tolerance``; else γ*. A chain of
        γ* never tests depth γ* + 1, so without the probe a depth that failed its first tries was written off
        for good.
        """
        from ..theory.speedup import batch_throughput

        if gamma < 1 or gamma >= self.max_gamma or self.tries[gamma] >= self.min_tries:
            return gamma
        alpha = self.alpha()
        alpha[gamma] = self._pooled()                                            # depth γ* + 1 at its prior
        deeper = batch_throughput(alpha, gamma + 1, live, draft, verify, overhead, self.draft_shared,
                                  self.verify_shared)
        return gamma + 1 if deeper > (1.0 - self.probe_tolerance) * rate else gamma

    def best_drafting_gamma(self) -> int:
        """The γ ≥ 1 of best predicted throughput: what a round drafts when drafting is re-tried against
        plain rounds (γ = 1 tests one depth only, and made drafting look worse than it is).
        """
        from ..theory.speedup import batch_throughput

        if not self.observed.any():
            return max(self.start, 1)
        live = max(int(self.live()), 1)
        draft, verify = self._round_costs(live)
        args = (live, draft, verify, self.round_overhead(live, draft, verify), self.draft_shared, self.verify_shared)
        rates = [batch_throughput(self.alpha(), g, *args) for g in range(1, self.max_gamma + 1)]
        return 1 + int(np.argmax(rates))

    def _round_costs(self, live: int):
        """(draft, target) cost profiles a one-length-per-round choice is priced with at ``live`` rows:
        the scaled draft curve and the target pass of each chain length (:meth:`_verify_by_size`)."""
        draft, verify = self._scaled_costs()
        return draft, self._verify_by_size(live, verify)

    def _verify_by_size(self, live: int, scaled):
        """The target pass of each chain length γ at ``live`` rows, t(live·(γ + 1)), as this batch
        measured it: the median of its recent passes of exactly that size (two or more), else the one-row
        curve times the batch's median ratio, capped at 1 — a size not yet read is priced no dearer than one
        row reading as many tokens, so it gets tried, and once read its own passes price it. Why not one ratio
        for every size: B rows' passes stand to the one-row curve in a ratio that changes with the size.
        Rows read in turn keep the scaled curve.
        """
        from ..theory.speedup import CostProfile

        if not self.verify_shared or self.passes is None:
            return scaled
        recent = [p for p in self.passes()[-64:] if p.priority >= 1 and p.rows == live]
        curve = self.costs.target
        cap = min(self._ratio(1, curve, True), 1.0)
        sizes = [live * (g + 1) for g in range(self.max_gamma + 1)]
        seconds = []
        for n in sizes:
            same = [p.seconds for p in recent if p.tokens == n]
            seconds.append(float(np.median(same)) if len(same) >= 2 else cap * float(curve(n)))
        return CostProfile(tuple(sizes), tuple(seconds))

    def _scaled_costs(self):
        from ..theory.speedup import CostProfile

        t, d = self.costs.target, self.costs.draft
        rt, rd = self._ratio(1, t, self.verify_shared), self._ratio(0, d, self.draft_shared)
        return (CostProfile(tuple(d.ks), tuple(rd * s for s in d.seconds)),
                CostProfile(tuple(t.ks), tuple(rt * s for s in t.seconds)))

    def _break_even(self, live: int, draft, verify, overhead) -> int:
        """``per_request``: the round's limit on every request's chain. 0 (a plain round) where no γ is
        predicted to beat plain rounds; else the LONGEST γ still predicted at least as fast as a plain
        round (a round lasts as long as its longest chain, so every round the requests draft under it
        is predicted to pay, while they keep the freedom to draft less)."""
        from ..theory.speedup import batch_throughput

        alpha = self.alpha()
        args = (live, draft, verify, overhead, self.draft_shared, self.verify_shared)
        rates = np.array([batch_throughput(alpha, g, *args) for g in range(min(self.max_gamma, 16) + 1)])
        if rates[1:].max() <= rates[0]:
            return 0
        return int(np.nonzero(rates >= rates[0])[0].max())

    def could_pay(self, margin: float = 1.0) -> bool:
        """Would drafting beat plain rounds by more than ``margin`` at this batch size if every drafted
        token were accepted? If not, plain rounds are never probed (a probe makes every draft row read its
        backlog of plain rounds — at the batch's start, its whole prompt)."""
        from ..theory.speedup import batch_throughput, best_batch_gamma

        draft, verify = self._scaled_costs()
        live = max(int(self.live()), 1)
        args = (live, draft, verify, self.round_overhead(live, draft, verify), self.draft_shared, self.verify_shared)
        gamma, rate = best_batch_gamma(np.ones(self.max_gamma), *args[:3], self.max_gamma, *args[3:])
        return gamma > 0 and rate > margin * batch_throughput(np.ones(self.max_gamma), 0, *args)

    def worth_starting(self, round_index: int) -> bool:
        """Shared rows: may the batch switch from plain rounds (or its start) to drafting? Only where the
        seconds drafting would save over the tokens the requests may still decode exceed ``start_margin``
        times what the switch costs first: one draft pass over every committed token the draft rows have not
        read (at the batch's start, every prompt). The saving is priced by :meth:`_start_rates`. Without the
        gate a large batch opened with a draft prefill of every prompt and lost to plain decoding. The answer
        is reused for ``recheck`` rounds.
        """
        if self.outlook is None:
            return True
        if self._payback is not None and round_index - self._payback[0] < self.recheck:
            return self._payback[1]
        remaining, backlog = self.outlook()
        draft, verify = self._scaled_costs()
        plain, fast = self._start_rates(draft, verify)
        saved = remaining / plain - remaining / fast if fast > plain else 0.0
        answer = saved > self.start_margin * float(draft(max(backlog, 1)))
        self._payback = (round_index, answer)
        return answer

    def _start_rates(self, draft, verify) -> tuple[float, float]:
        """(plain, drafting) tokens per second of the batch as it is now, priced with the (scaled) cost
        curves ``draft`` and ``verify``: the model's best chain against plain rounds
        (:func:`~specbound.theory.speedup.best_batch_gamma`) at the batch's own acceptance estimate once it has
        drafted, else at the acceptance the pair showed in earlier runs (``shown``), else at full acceptance.
        """
        from ..theory.speedup import batch_throughput, best_batch_gamma

        live = max(int(self.live()), 1)
        if self.observed.any():
            alpha = self.alpha()
        elif self.shown is not None and len(self.shown):
            alpha = np.pad(self.shown, (0, self.max_gamma - len(self.shown)), mode="edge")
        else:
            alpha = np.ones(self.max_gamma)
        args = (draft, verify, self.max_gamma, self.round_overhead(live, draft, verify), self.draft_shared,
                self.verify_shared)
        gamma, fast = best_batch_gamma(alpha, live, *args)
        plain = batch_throughput(alpha, 0, live, draft, verify, args[3], self.draft_shared, self.verify_shared)
        return plain, (fast if gamma > 0 else plain)

    def round_overhead(self, live: int, draft, verify) -> tuple[float, float, float]:
        """(w_plain, c₀, c₁): seconds per round outside the passes — a plain round w_plain, a drafted one
        c₀ + c₁·γ — from the recent timed rounds at this batch size: each round's seconds minus the passes the
        scheduler timed inside it (without pass records: minus the passes' predicted cost). Medians per chain
        length; c₁ the least-squares slope through those medians once two lengths have been timed; a term not
        yet measured is 0. Medians of timed passes, because on a busy machine one slow round charged to c₁
        made the chosen length flip from round to round.
        """
        from ..theory.speedup import rows_pass_seconds

        if self._work:
            timed = [(g, w) for g, w, b in self._work if b == live]
        else:
            timed = [(g, s - g * float(rows_pass_seconds(draft, live, 1, self.draft_shared))
                      - float(rows_pass_seconds(verify, live, g + 1, self.verify_shared)))
                     for g, done in self.rounds.items() for _, s, b in done if b == live]
        by_depth: dict[int, list[float]] = {}
        for g, w in timed:
            by_depth.setdefault(g, []).append(w)
        medians = {g: float(np.median(ws[-self.window:])) for g, ws in by_depth.items()}
        w_plain = max(medians.pop(0, 0.0), 0.0)
        if not medians:
            return w_plain, 0.0, 0.0
        lengths = sorted(medians)
        gammas = np.array(lengths, dtype=float)
        work = np.array([medians[g] for g in lengths])
        c1 = max(float(np.polyfit(gammas, work, 1)[0]), 0.0) if len(gammas) > 1 else 0.0
        c0 = max(float(np.median(work - c1 * gammas)), 0.0)
        return w_plain, c0, c1

    #: how far drafting's measured rate must beat plain rounds' cheapest price to skip their trial
    plain_margin = 0.10

    def _plain_ruled_out(self) -> bool:
        """Shared rows: do the timed drafting rounds beat plain rounds by more than ``plain_margin`` even
        with plain rounds priced at their cheapest — the one-row pass t(B) times the batch's pass ratio capped
        at 1, with no work outside the pass unless measured? Then plain rounds are not tried (a trial costs a
        switch, its timed rounds and a switch back that makes the draft rows re-read the backlog). Plain
        rounds' cost is known in advance; drafting's rests on acceptance, so drafting is what needs the check.
        """
        from ..theory.speedup import batch_throughput

        drafting = self._rate(1)
        if drafting is None:
            return False
        live = max(int(self.live()), 1)
        draft, verify = self._round_costs(live)
        overhead = self.round_overhead(live, draft, verify)
        plain = batch_throughput(self.alpha(), 0, live, draft, verify, overhead, self.draft_shared,
                                 self.verify_shared)
        measured = self._rate(0)
        if measured is not None:
            plain = max(plain, measured)
        return drafting > (1.0 + self.plain_margin) * plain

    def _round_tokens(self, gamma: int, round_index: int, live: int) -> float:
        """Tokens the batch committed in a timed round: every request's accepted + 1 as observed (a plain
        round: one per live request)."""
        return self._tokens.get(round_index, 0.0) if gamma > 0 else float(live)

    def _rate(self, gamma: int) -> float | None:
        """Tokens per second of the recent timed rounds of drafting (any γ > 0: the check asks whether
        drafting beats plain rounds; rating each γ apart made every new γ* a new trial) or of plain rounds
        (γ = 0), counting only rounds every request has observed: when the first request asks for round r + 1,
        the others may not yet have verified round r (they share its pass, then verify in their own threads),
        so round r is counted from round r + 2 on. Counting it at once credited a drafted round with the first
        request's tokens only, and drafting was dropped.
        """
        done = sorted((r, s, b, g) for g, entries in self.rounds.items() if (g > 0) == (gamma > 0)
                      for r, s, b in entries if r <= self._deciding - 2)[-self.window:]
        if len(done) < self.trial:
            return None
        return sum(self._round_tokens(g, r, b) for r, _, b, g in done) / max(sum(s for _, s, _, _ in done), 1e-9)

    def gamma_for_round(self, round_index: int) -> int:
        import time

        with self._lock:
            if round_index in self._gammas:
                return self._gammas[round_index]
            now = time.perf_counter()
            last = round_index - 1
            if last in self._started and last in self._gammas:       # time the round that just ended
                g = self._gammas[last]
                switched = last - 1 not in self._gammas or (self._gammas[last - 1] > 0) != (g > 0)
                if self.per_request and g > 0:                        # the round lasted its longest chain
                    g = self._depth.get(last, 0)
                if not switched:      # the first drafted round after plain ones (or of the batch: the draft reads
                                      # the prompts) also reads the backlog: a switch cost, not timed
                    self.rounds.setdefault(g, []).append((last, now - self._started[last], self._live_at.get(last, 1)))
                    if last in self._pass_at and self.passes is not None:
                        inside = sum(p.seconds for p in self.passes()[self._pass_at[last]:])
                        self._work.append((g, now - self._started[last] - inside, self._live_at.get(last, 1)))
            self._deciding = round_index
            best = self._per_request_model(round_index) if self.per_request else self.model_gamma()
            other = 0 if best > 0 else (self.max_gamma if self.per_request else self.best_drafting_gamma())
            untried = [] if self.per_request else [g for g in (best, other) if self._rate(g) is None]
            if self.per_request:            # the model decides; the other choice is probed now and then
                gamma = best
                if round_index >= self._next_probe and (other == 0 or self.could_pay(self.probe_margin)):
                    gamma = other
                    self._probes += 1
                    self._next_probe = round_index + self.explore_every * 2 ** min(self._probes, 4)
            elif untried == [0] and self._plain_ruled_out():
                gamma = best        # plain rounds could not keep up even priced at their cheapest
                self._next_probe = max(self._next_probe, round_index + self.explore_every)
            elif untried:       # a choice on trial keeps the rounds until they are timed (a switching round is
                                # not, and a model whose γ* flipped between 0 and 1 alternated untimed rounds)
                prev = self._gammas.get(round_index - 1)
                gamma = prev if prev in untried else untried[0]
                self._next_probe = max(self._next_probe, round_index + self.explore_every)   # re-tries count from here
            elif self._hold is not None and round_index <= self._hold[1]:
                gamma = self._hold[0]       # a re-try runs until its rounds are timed (switch + lag + trial)
            else:                           # drafting must beat plain rounds by ``switch_margin`` (a switch
                                            # to drafting first reads the backlog, which no timed round shows)
                drafting, plain = (best, other) if best > 0 else (other, best)
                gamma = drafting if self._rate(drafting) > (1 + self.switch_margin) * self._rate(plain) else plain
                if round_index >= self._next_probe and not (gamma > 0 and self._plain_ruled_out()):
                    gamma = other if gamma == best else best              # re-try the other, less often each time
                    self._probes += 1
                    self._next_probe = round_index + self.explore_every * 2 ** min(self._probes, 4)
                    self._hold = (gamma, round_index + self.trial)
            if not self.per_request and gamma > 0 and not self._gammas.get(round_index - 1) \
                    and not self.worth_starting(round_index):
                gamma = 0                   # starting to draft could not pay for the draft rows' backlog
            self._gammas[round_index] = gamma
            self._started[round_index] = now
            self._live_at[round_index] = int(self.live())
            if self.passes is not None:
                self._pass_at[round_index] = len(self.passes())
            return gamma

    def _per_request_model(self, round_index: int) -> int:
        """``per_request``: the model's limit for this round. A "plain" answer is reused for up to
        ``recheck`` rounds while nothing could change it (no drafted round observed, the same number of live
        requests): in plain rounds the model's inputs move only with the passes' timing, and its computation
        (~1 ms a round, under the interpreter every request shares) is a visible share of a plain round at 8
        requests.
        """
        live = int(self.live())
        since = self._plain_since
        if since is not None and since[1:] == (live, self._learned) and round_index - since[0] < self.recheck:
            return 0
        best = self.model_gamma()
        self._plain_since = (round_index, live, self._learned) if best == 0 else None
        return best

    def observe(self, drafted: int, accepted: int, round_index: int | None = None, confidences=None) -> None:
        """One request's round: ``drafted`` chain tokens, the first ``accepted`` of them accepted;
        ``confidences``: the draft's probability of each greedy token it drafted (the prior of
        :meth:`_pooled`), None for sampled chains."""
        with self._lock:
            if confidences is not None and len(confidences):
                self.confidence_sum += float(np.sum(confidences))
                self.confidence_count += len(confidences)
            tested = min(drafted, accepted + 1)
            self._learned += tested > 0
            self.tries[:tested] += 1
            self.observed[:tested] = 1
            self.hits[:min(accepted, drafted)] += 1
            if round_index is not None:
                self._tokens[round_index] = self._tokens.get(round_index, 0.0) + accepted + 1
                self._depth[round_index] = max(self._depth.get(round_index, 0), int(drafted))


class ShapeChoice:
    """Which drafted SHAPE a round uses (``shape="auto"``): the one with the highest predicted tokens
    per second, from what the shapes did on this text.

    Per shape s: the predicted tokens per round E_s is the recency-weighted mean (weight ``memory`` per
    round of that shape) of 1 + E[X | drafted tree] over its rounds — the exact expected accepted
    tokens GIVEN the tree it drafted (Pankratov & Alistarh 2026, §2 tree value; under recursive
    rejection :func:`specbound.theory.sampled_tree_value`, under block verification Σ_i P(τ ≥ i)), so
    the verifier's coins add no noise — and the cost S_s is the recency-weighted mean wall time of its
    rounds as measured (drafting, the target pass, verification and the loop's own work: everything
    the choice changes). The rate is E_s / S_s.

    Schedule: the first shape alone for ``warmup`` rounds (the chain's calibration and length settle,
    and the other shapes are sized from it); then every other shape for ``trial`` rounds; then the
    best rate, a shape that lost retried after ``explore_every`` rounds, then 2, 4, 8, 16 times as long
    (reset when it wins). The choice depends only on rounds already verified, never on the round it
    sizes, so every round stays a lossless verification of the target's law.
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
