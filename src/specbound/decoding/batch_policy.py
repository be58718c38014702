"""``gamma="auto"`` for B requests decoded together: ONE chain length per round for every request.

:class:`BatchDraftLength` is what the batched loop asks (``gamma_for_round``) and tells (``observe``).
Its parts: :class:`BatchLengthOptions` (its settings), :class:`PooledAcceptance` (the per-depth
acceptance pooled over the requests), :class:`RoundClock` (each round's γ and what the timed rounds
cost), :class:`PassPricing` (the one-row cost curves priced by the batch's own passes) and
:class:`BatchRates` (the tokens per second the cost model predicts for each choice). Sizing never
changes verification. The measurements behind each rule: docs/results/HISTORY.md (the batch policy).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from ..theory.speedup import CostProfile, batch_throughput, best_batch_gamma, rows_pass_seconds
from .acceptance import shrunk_acceptance
from .costs import pass_ratios

__all__ = ["BatchDraftLength", "BatchLengthOptions", "BatchRates", "PassPricing", "PooledAcceptance", "RoundClock"]


@dataclass
class BatchLengthOptions:
    """The settings of :class:`BatchDraftLength`: its keyword options (same names) and the margins its
    rules use. Why each margin has its value: the comments here and docs/results/HISTORY.md."""

    max_gamma: int = 8              # the longest chain (per_request: the highest limit) a round may get
    start: int = 2                  # the chain length of the first rounds, before anything is observed
    explore_every: int = 16         # rounds before the choice not taken is re-tried (then 2, 4, 8, 16 x as long)
    trial: int = 2                  # timed rounds a choice needs before its measured rate counts
    window: int = 8                 # recent timed rounds a rate or a median reads
    rows_shared: tuple[bool, bool] = (True, True)   # (draft, target): c(B·k) for rows sharing a pass, else B·c(k)
    per_request: bool = False       # rows read in turn: each request sizes its own chain under the round's limit
    recheck: int = 8                # rounds a "plain" (or a start-gate) answer is reused while nothing changed
    # per_request: probe only where drafting, fully accepted, would beat plain rounds by more than this. A
    # probe's draft rows read their prompts (a one-time cost); but the ceiling is priced with the cost prior
    # before any draft pass was timed, and a margin of 1.2 kept a dev batch of 2 from ever drafting on a
    # stale prior (fixed γ = 6 measured 1.36x there), so the default stays 1.0
    probe_margin: float = 1.0
    # starting needs twice the backlog's read: the saving is a prediction (at full acceptance, where the pair
    # has shown none, an upper bound: at ~0.9 per depth, as on code, a chain of 8 keeps about half of it), and
    # the model over-rated drafting at 4 requests by 10-20% (int8 target, GSM8K 133-140: γ = 4 predicted 1.11x
    # at 0.9 per depth, measured 0.92-1.04x). With 1.0, a batch of 8 whose bound saved about the draft's
    # prefill started drafting on the noise of the target's measured passes and decoded at 0.57x plain (dev,
    # HumanEval 58-65)
    start_margin: float = 2.0
    switch_margin: float = 0.05     # how far drafting's measured rate must beat plain rounds' to be kept
    shrinkage: float = 2.0          # weight (in observations) of the all-depth acceptance in each depth's estimate
    confidence_weight: float = 8.0  # weight of the draft's mean confidence as the prior of the pooled acceptance
    min_tries: int = 8              # tries a depth gets before its own acceptance may keep chains short of it
    # how far below γ*'s predicted rate the next depth may be and still be probed: the model's error. With 0
    # (probe only where predicted faster), a pass size never read is priced at the curve and predicted within
    # 0.3% of γ* = 2 for 18 rounds; read, it was 7% faster (int8 target, 2 requests, HumanEval 134-135: γ = 2
    # until round 23, then 4)
    probe_tolerance: float = 0.05
    plain_margin: float = 0.10      # how far drafting's measured rate must beat plain rounds' cheapest price
                                    # to skip their trial

    def __post_init__(self):
        self.max_gamma, self.start, self.explore_every = int(self.max_gamma), int(self.start), int(self.explore_every)
        self.trial, self.window = int(self.trial), int(self.window)
        draft_shared, verify_shared = (bool(x) for x in self.rows_shared)
        self.rows_shared = (draft_shared, verify_shared)
        self.per_request = bool(self.per_request)
        self.recheck = max(int(self.recheck), 1)
        self.probe_margin = float(self.probe_margin)

    @property
    def draft_shared(self) -> bool:
        return self.rows_shared[0]

    @property
    def verify_shared(self) -> bool:
        return self.rows_shared[1]


class PooledAcceptance:
    """Acceptance per depth of the batch's chains, pooled over the requests: what they observed.

    :meth:`alpha` shrinks each depth's rate toward :meth:`pooled`, the rate over all depths, whose
    prior is the draft's own mean confidence in the tokens it drafted greedily.
    """

    def __init__(self, options: BatchLengthOptions):
        self.options = options
        self.hits = np.zeros(options.max_gamma)      # accepted / tested drafts per depth, as observed
        self.tries = np.zeros(options.max_gamma)
        self.observed = np.zeros(options.max_gamma)
        self.confidence_sum, self.confidence_count = 0.0, 0   # the draft's own confidence in its greedy tokens
        self.learned = 0                             # drafted rounds observed (the acceptance changed)

    def observe(self, drafted: int, accepted: int, confidences=None) -> None:
        """One request's round: ``drafted`` chain tokens, the first ``accepted`` of them accepted."""
        if confidences is not None and len(confidences):
            self.confidence_sum += float(np.sum(confidences))
            self.confidence_count += len(confidences)
        tested = min(drafted, accepted + 1)
        self.learned += tested > 0
        self.tries[:tested] += 1
        self.observed[:tested] = 1
        self.hits[:min(accepted, drafted)] += 1

    def alpha(self) -> np.ndarray:
        """Acceptance per depth: (hits_i + s·ā) / (tries_i + s), shrunk toward ā, the acceptance over ALL
        depths, with weight s = ``shrinkage``; a depth never tested gets ā. Why not a flat prior per depth:
        a depth tested once or twice sat near ½ however well the shallower depths accepted, so long chains
        were priced as losing, and short chains never test deep depths.
        """
        return shrunk_acceptance(self.hits, self.tries, self.pooled(), self.options.shrinkage)

    def pooled(self) -> float:
        """The acceptance over all depths' tests, under a Beta prior centred on the draft's mean confidence
        in the tokens it drafted greedily so far (the soft-max of its arg-max), with weight
        ``confidence_weight``; without confidences (sampled chains) Beta(1, 1). Why: the first rounds test a
        handful of tokens, and a prior of ½ held the pooled acceptance far below code's ~0.9 for a dozen
        rounds; on this pair the draft's mean confidence is close to the agreement it predicts.
        """
        if self.confidence_count:
            mean, weight = self.confidence_sum / self.confidence_count, self.options.confidence_weight
        else:
            mean, weight = 0.5, 2.0
        return float((self.hits.sum() + weight * mean) / (self.tries.sum() + weight))


class RoundClock:
    """Which γ each round of the batch drafted, and what its timed rounds cost.

    A round is timed when the next one is first asked for: its seconds, its live requests and, with the
    scheduler's pass records, its seconds outside the passes. A round that switched between plain and
    drafting is not timed (its draft rows first read their backlog: a switch cost). The tokens each
    round committed come from the requests' observations (:meth:`count`).
    """

    def __init__(self, options: BatchLengthOptions):
        self.options = options
        self.gammas: dict[int, int] = {}
        self.started: dict[int, float] = {}
        self.tokens: dict[int, float] = {}
        self.live_at: dict[int, int] = {}
        self.depth: dict[int, int] = {}              # the longest chain drafted in a round (per_request)
        self.rounds: dict[int, list[tuple[int, float, int]]] = {}   # γ -> [(round, seconds, live requests)] timed
        self.deciding = 0                            # the round whose γ was decided last
        self.pass_at: dict[int, int] = {}            # the scheduler's pass count when a round began
        self.work: list[tuple[int, float, int]] = []   # (depth, seconds outside the passes, live) per timed round

    def end(self, round_index: int, now: float, passes) -> None:
        """Round ``round_index`` is being decided at ``now``: time the round that just ended."""
        last = round_index - 1
        if last in self.started and last in self.gammas:
            g = self.gammas[last]
            switched = last - 1 not in self.gammas or (self.gammas[last - 1] > 0) != (g > 0)
            if self.options.per_request and g > 0:   # the round lasted its longest chain
                g = self.depth.get(last, 0)
            if not switched:      # the first drafted round after plain ones (or of the batch: the draft reads
                                  # the prompts) also reads the backlog: a switch cost, not timed
                self.rounds.setdefault(g, []).append((last, now - self.started[last], self.live_at.get(last, 1)))
                if last in self.pass_at and passes is not None:
                    inside = sum(p.seconds for p in passes()[self.pass_at[last]:])
                    self.work.append((g, now - self.started[last] - inside, self.live_at.get(last, 1)))
        self.deciding = round_index

    def begin(self, round_index: int, gamma: int, now: float, live: int, passes) -> None:
        """Round ``round_index`` drafts ``gamma`` from ``now`` on, with ``live`` requests."""
        self.gammas[round_index] = gamma
        self.started[round_index] = now
        self.live_at[round_index] = live
        if passes is not None:
            self.pass_at[round_index] = len(passes())

    def count(self, round_index: int, drafted: int, accepted: int) -> None:
        """One request's tokens of round ``round_index``: ``accepted`` + 1, from a chain of ``drafted``."""
        self.tokens[round_index] = self.tokens.get(round_index, 0.0) + accepted + 1
        self.depth[round_index] = max(self.depth.get(round_index, 0), int(drafted))

    def round_tokens(self, gamma: int, round_index: int, live: int) -> float:
        """Tokens the batch committed in a timed round: every request's accepted + 1 as observed (a plain
        round: one per live request)."""
        return self.tokens.get(round_index, 0.0) if gamma > 0 else float(live)

    def rate(self, gamma: int) -> float | None:
        """Tokens per second of the recent timed rounds of drafting (any γ > 0: the check asks whether
        drafting beats plain rounds; rating each γ apart made every new γ* a new trial) or of plain rounds
        (γ = 0), counting only rounds every request has observed: when the first request asks for round r + 1,
        the others may not yet have verified round r (they share its pass, then verify in their own threads),
        so round r is counted from round r + 2 on. Counting it at once credited a drafted round with the first
        request's tokens only, and drafting was dropped.
        """
        done = sorted((r, s, b, g) for g, entries in self.rounds.items() if (g > 0) == (gamma > 0)
                      for r, s, b in entries if r <= self.deciding - 2)[-self.options.window:]
        if len(done) < self.options.trial:
            return None
        return sum(self.round_tokens(g, r, b) for r, _, b, g in done) / max(sum(s for _, s, _, _ in done), 1e-9)

    def round_overhead(self, live: int, draft, verify) -> tuple[float, float, float]:
        """(w_plain, c₀, c₁): seconds per round outside the passes — a plain round w_plain, a drafted one
        c₀ + c₁·γ — from the recent timed rounds at this batch size: each round's seconds minus the passes the
        scheduler timed inside it (without pass records: minus the passes' predicted cost). Medians per chain
        length; c₁ the least-squares slope through those medians once two lengths have been timed; a term not
        yet measured is 0. Medians of timed passes, because on a busy machine one slow round charged to c₁
        made the chosen length flip from round to round.
        """
        o = self.options
        if self.work:
            timed = [(g, w) for g, w, b in self.work if b == live]
        else:
            timed = [(g, s - g * float(rows_pass_seconds(draft, live, 1, o.draft_shared))
                      - float(rows_pass_seconds(verify, live, g + 1, o.verify_shared)))
                     for g, done in self.rounds.items() for _, s, b in done if b == live]
        by_depth: dict[int, list[float]] = {}
        for g, w in timed:
            by_depth.setdefault(g, []).append(w)
        medians = {g: float(np.median(ws[-o.window:])) for g, ws in by_depth.items()}
        w_plain = max(medians.pop(0, 0.0), 0.0)
        if not medians:
            return w_plain, 0.0, 0.0
        lengths = sorted(medians)
        gammas = np.array(lengths, dtype=float)
        work = np.array([medians[g] for g in lengths])
        c1 = max(float(np.polyfit(gammas, work, 1)[0]), 0.0) if len(gammas) > 1 else 0.0
        c0 = max(float(np.median(work - c1 * gammas)), 0.0)
        return w_plain, c0, c1


class PassPricing:
    """The one-row cost curves (``costs``: target and draft) priced by the batch's own passes
    (``passes``: the scheduler's records, or None)."""

    def __init__(self, costs, passes, options: BatchLengthOptions):
        self.costs, self.passes, self.options = costs, passes, options
        self.memo: dict = {}                         # (priority, curve, shared) -> (passes seen, ratio)

    def ratio(self, priority: int, curve, shared: bool) -> float:
        """Median ratio of the batch's recent passes of ``priority`` (1: target, 0: draft) to ``curve``."""
        records = self.passes() if self.passes is not None else []
        key, seen = (priority, id(curve), shared), len(records)   # one decision reads a ratio up to three times
        cached = self.memo.get(key)
        if cached is not None and cached[0] == seen:
            return cached[1]
        recent = records[-64:]
        # a round's passes read at most max_gamma + 1 tokens per row (the first draft read of a round: the
        # bonus token too); longer ones are prompts or backlogs, whose cost per token is no guide to a round's
        ratios = pass_ratios([p for p in recent
                              if p.priority == priority and p.tokens <= (self.options.max_gamma + 2) * p.rows],
                             curve, shared)
        ratio = float(np.median(ratios)) if ratios else 1.0
        self.memo[key] = (seen, ratio)
        return ratio

    def scaled_costs(self):
        """(draft, target) curves, each times the batch's median ratio to it."""
        t, d = self.costs.target, self.costs.draft
        rt = self.ratio(1, t, self.options.verify_shared)
        rd = self.ratio(0, d, self.options.draft_shared)
        return (CostProfile(tuple(d.ks), tuple(rd * s for s in d.seconds)),
                CostProfile(tuple(t.ks), tuple(rt * s for s in t.seconds)))

    def round_costs(self, live: int):
        """(draft, target) cost profiles a one-length-per-round choice is priced with at ``live`` rows:
        the scaled draft curve and the target pass of each chain length (:meth:`verify_by_size`)."""
        draft, verify = self.scaled_costs()
        return draft, self.verify_by_size(live, verify)

    def verify_by_size(self, live: int, scaled):
        """The target pass of each chain length γ at ``live`` rows, t(live·(γ + 1)), as this batch
        measured it: the median of its recent passes of exactly that size (two or more), else the one-row
        curve times the batch's median ratio, capped at 1 — a size not yet read is priced no dearer than one
        row reading as many tokens, so it gets tried, and once read its own passes price it. Why not one ratio
        for every size: B rows' passes stand to the one-row curve in a ratio that changes with the size.
        Rows read in turn keep the scaled curve.
        """
        if not self.options.verify_shared or self.passes is None:
            return scaled
        recent = [p for p in self.passes()[-64:] if p.priority >= 1 and p.rows == live]
        curve = self.costs.target
        cap = min(self.ratio(1, curve, True), 1.0)
        sizes = [live * (g + 1) for g in range(self.options.max_gamma + 1)]
        seconds = []
        for n in sizes:
            same = [p.seconds for p in recent if p.tokens == n]
            seconds.append(float(np.median(same)) if len(same) >= 2 else cap * float(curve(n)))
        return CostProfile(tuple(sizes), tuple(seconds))


class BatchRates:
    """What the cost model predicts for the batch as it is now (:func:`~specbound.theory.speedup.batch_throughput`
    at the pooled acceptance, the batch's prices and its work outside the passes): the chain length of
    best throughput, and whether drafting can pay at all, or pay for the draft rows' backlog."""

    def __init__(self, options: BatchLengthOptions, acceptance: PooledAcceptance, pricing: PassPricing,
                 clock: RoundClock, live, outlook=None, shown=None):
        self.options, self.acceptance, self.pricing, self.clock = options, acceptance, pricing, clock
        self.live = live
        # outlook() -> (tokens the live requests may still decode, committed tokens their draft rows have not
        # read): what starting to draft after plain rounds can win and what it costs first (None: not priced)
        self.outlook = outlook
        # the pair's per-depth acceptance shown in earlier runs (acceptance.ShownAcceptance.per_depth), what the
        # start is priced at before this batch has drafted; None: full acceptance, an upper bound
        self.shown = None if shown is None else np.asarray(shown, dtype=np.float64)[:options.max_gamma]
        self.payback: tuple[int, bool] | None = None  # (round, answer) of the last worth_starting check

    def model_gamma(self) -> int:
        """The cost model's γ* for the batch as it is now (no timing of rounds). With ``per_request``:
        the limit under which each request's own budget sizes its chain (:meth:`break_even`, 0 = a
        plain round); the first round is priced with the prior acceptance (½ per depth) instead of
        drafting ``start`` tokens."""
        o = self.options
        if not self.acceptance.observed.any() and not o.per_request:
            return o.start
        live = max(int(self.live()), 1)
        draft, verify = self.pricing.scaled_costs() if o.per_request else self.pricing.round_costs(live)
        overhead = self.clock.round_overhead(live, draft, verify)
        if o.per_request:
            return self.break_even(live, draft, verify, overhead)
        gamma, rate = best_batch_gamma(self.acceptance.alpha(), live, draft, verify, o.max_gamma, overhead,
                                       o.draft_shared, o.verify_shared)
        return self.probe_deeper(gamma, rate, live, draft, verify, overhead)

    def probe_deeper(self, gamma: int, rate: float, live: int, draft, verify, overhead) -> int:
        """γ* + 1 instead of the model's γ* ≥ 1 while depth γ* + 1 has had fewer than ``min_tries`` tries and
        would pay at the acceptance over all depths (its prior), within ``probe_tolerance``; else γ*. A chain of
        γ* never tests depth γ* + 1, so without the probe a depth that failed its first tries was written off
        for good.
        """
        o = self.options
        if gamma < 1 or gamma >= o.max_gamma or self.acceptance.tries[gamma] >= o.min_tries:
            return gamma
        alpha = self.acceptance.alpha()
        alpha[gamma] = self.acceptance.pooled()                                  # depth γ* + 1 at its prior
        deeper = batch_throughput(alpha, gamma + 1, live, draft, verify, overhead, o.draft_shared, o.verify_shared)
        return gamma + 1 if deeper > (1.0 - o.probe_tolerance) * rate else gamma

    def best_drafting_gamma(self) -> int:
        """The γ ≥ 1 of best predicted throughput: what a round drafts when drafting is re-tried against
        plain rounds (γ = 1 tests one depth only, and made drafting look worse than it is)."""
        o = self.options
        if not self.acceptance.observed.any():
            return max(o.start, 1)
        live = max(int(self.live()), 1)
        draft, verify = self.pricing.round_costs(live)
        args = (live, draft, verify, self.clock.round_overhead(live, draft, verify), o.draft_shared, o.verify_shared)
        rates = [batch_throughput(self.acceptance.alpha(), g, *args) for g in range(1, o.max_gamma + 1)]
        return 1 + int(np.argmax(rates))

    def break_even(self, live: int, draft, verify, overhead) -> int:
        """``per_request``: the round's limit on every request's chain. 0 (a plain round) where no γ is
        predicted to beat plain rounds; else the LONGEST γ still predicted at least as fast as a plain
        round (a round lasts as long as its longest chain, so every round the requests draft under it
        is predicted to pay, while they keep the freedom to draft less)."""
        o = self.options
        alpha = self.acceptance.alpha()
        args = (live, draft, verify, overhead, o.draft_shared, o.verify_shared)
        rates = np.array([batch_throughput(alpha, g, *args) for g in range(min(o.max_gamma, 16) + 1)])
        if rates[1:].max() <= rates[0]:
            return 0
        return int(np.nonzero(rates >= rates[0])[0].max())

    def could_pay(self, margin: float = 1.0) -> bool:
        """Would drafting beat plain rounds by more than ``margin`` at this batch size if every drafted
        token were accepted? If not, plain rounds are never probed (a probe makes every draft row read its
        backlog of plain rounds — at the batch's start, its whole prompt)."""
        o = self.options
        draft, verify = self.pricing.scaled_costs()
        live = max(int(self.live()), 1)
        args = (live, draft, verify, self.clock.round_overhead(live, draft, verify), o.draft_shared, o.verify_shared)
        gamma, rate = best_batch_gamma(np.ones(o.max_gamma), *args[:3], o.max_gamma, *args[3:])
        return gamma > 0 and rate > margin * batch_throughput(np.ones(o.max_gamma), 0, *args)

    def worth_starting(self, round_index: int) -> bool:
        """Shared rows: may the batch switch from plain rounds (or its start) to drafting? Only where the
        seconds drafting would save over the tokens the requests may still decode exceed ``start_margin``
        times what the switch costs first: one draft pass over every committed token the draft rows have not
        read (at the batch's start, every prompt). The saving is priced by :meth:`start_rates`. Without the
        gate a large batch opened with a draft prefill of every prompt and lost to plain decoding. The answer
        is reused for ``recheck`` rounds.
        """
        o = self.options
        if self.outlook is None:
            return True
        if self.payback is not None and round_index - self.payback[0] < o.recheck:
            return self.payback[1]
        remaining, backlog = self.outlook()
        draft, verify = self.pricing.scaled_costs()
        plain, fast = self.start_rates(draft, verify)
        saved = remaining / plain - remaining / fast if fast > plain else 0.0
        answer = saved > o.start_margin * float(draft(max(backlog, 1)))
        self.payback = (round_index, answer)
        return answer

    def start_rates(self, draft, verify) -> tuple[float, float]:
        """(plain, drafting) tokens per second of the batch as it is now, priced with the (scaled) cost
        curves ``draft`` and ``verify``: the model's best chain against plain rounds
        (:func:`~specbound.theory.speedup.best_batch_gamma`) at the batch's own acceptance estimate once it has
        drafted, else at the acceptance the pair showed in earlier runs (``shown``), else at full acceptance.
        """
        o = self.options
        live = max(int(self.live()), 1)
        if self.acceptance.observed.any():
            alpha = self.acceptance.alpha()
        elif self.shown is not None and len(self.shown):
            alpha = np.pad(self.shown, (0, o.max_gamma - len(self.shown)), mode="edge")
        else:
            alpha = np.ones(o.max_gamma)
        args = (draft, verify, o.max_gamma, self.clock.round_overhead(live, draft, verify), o.draft_shared,
                o.verify_shared)
        gamma, fast = best_batch_gamma(alpha, live, *args)
        plain = batch_throughput(alpha, 0, live, draft, verify, args[3], o.draft_shared, o.verify_shared)
        return plain, (fast if gamma > 0 else plain)

    def plain_ruled_out(self) -> bool:
        """Shared rows: do the timed drafting rounds beat plain rounds by more than ``plain_margin`` even
        with plain rounds priced at their cheapest — the one-row pass t(B) times the batch's pass ratio capped
        at 1, with no work outside the pass unless measured? Then plain rounds are not tried (a trial costs a
        switch, its timed rounds and a switch back that makes the draft rows re-read the backlog). Plain
        rounds' cost is known in advance; drafting's rests on acceptance, so drafting is what needs the check.
        """
        o = self.options
        drafting = self.clock.rate(1)
        if drafting is None:
            return False
        live = max(int(self.live()), 1)
        draft, verify = self.pricing.round_costs(live)
        overhead = self.clock.round_overhead(live, draft, verify)
        plain = batch_throughput(self.acceptance.alpha(), 0, live, draft, verify, overhead, o.draft_shared,
                                 o.verify_shared)
        measured = self.clock.rate(0)
        if measured is not None:
            plain = max(plain, measured)
        return drafting > (1.0 + o.plain_margin) * plain


def _option(name: str) -> property:
    """A field of :class:`BatchLengthOptions`, read and set on the policy itself."""
    return property(lambda self: getattr(self.options, name),
                    lambda self, value: setattr(self.options, name, value), doc=f"``options.{name}``")


class BatchDraftLength:
    """``gamma="auto"`` for B requests decoded together: ONE chain length per round for every request.

    A round lasts as long as its longest draft, so ragged per-request lengths pay for draft passes that
    hold one or two rows (measured: they lost to a fixed γ). γ* maximises the predicted total throughput
    (:class:`BatchRates`) from the acceptance pooled over the requests (:class:`PooledAcceptance`), the cost
    curves priced by the batch's own passes (``passes``: the scheduler's records; :class:`PassPricing`; ``live``:
    requests still decoding) and each round's work outside the passes (:class:`RoundClock`). A batch starts
    drafting only where that repays the draft rows' backlog (``outlook``, priced at the acceptance ``shown`` in
    earlier runs), probes the depth beyond γ* and checks γ* against timed plain rounds (``trial`` rounds each,
    re-tried after ``explore_every``, then 2, 4, 8, 16 times as long). With ``per_request`` (rows read in turn)
    each request sizes its own chain under the model's limit. The options: :class:`BatchLengthOptions`.
    A round's γ is fixed when its first request asks; sizing never changes verification.
    """

    def __init__(self, costs, *, passes=None, live=None, outlook=None, shown=None, **options):
        self.options = BatchLengthOptions(**options)
        self.passes, self.live = passes, live or (lambda: 1)
        self.acceptance = PooledAcceptance(self.options)
        self.clock = RoundClock(self.options)
        self.pricing = PassPricing(costs, passes, self.options)
        self.rates = BatchRates(self.options, self.acceptance, self.pricing, self.clock, self.live, outlook, shown)
        self._hold: tuple[int, int] | None = None    # (γ, last round) of a re-try in progress
        self._probes = 0
        # per_request: drafting is probed at the second round (the first reads the prompts) — under the prior
        # (½ per depth) the model rarely drafts, and waiting ``explore_every`` plain rounds for the first look
        # at what the requests accept cost a quarter of a 64-token run at 2 requests (dev, HumanEval 58-61)
        self._next_probe = 2 if self.options.per_request else self.options.explore_every
        self._plain_since: tuple[int, int, int] | None = None   # (round, live, learned) of the model's last "plain"
        self._lock = threading.Lock()

    max_gamma = _option("max_gamma")
    start = _option("start")
    explore_every = _option("explore_every")
    trial = _option("trial")
    window = _option("window")
    per_request = _option("per_request")
    recheck = _option("recheck")
    probe_margin = _option("probe_margin")
    start_margin = _option("start_margin")
    switch_margin = _option("switch_margin")
    shrinkage = _option("shrinkage")
    confidence_weight = _option("confidence_weight")
    min_tries = _option("min_tries")
    probe_tolerance = _option("probe_tolerance")
    plain_margin = _option("plain_margin")

    # ---------------------------------------------------------------- what the batched loop calls
    def gamma_for_round(self, round_index: int) -> int:
        """The chain length (``per_request``: the limit) of round ``round_index``, fixed when its first
        request asks; the round that just ended is timed then."""
        with self._lock:
            if round_index in self.clock.gammas:
                return self.clock.gammas[round_index]
            now = time.perf_counter()
            self.clock.end(round_index, now, self.passes)
            gamma = self._choose(round_index)
            self.clock.begin(round_index, gamma, now, int(self.live()), self.passes)
            return gamma

    def _choose(self, round_index: int) -> int:
        o, rate = self.options, self.clock.rate
        best = self._per_request_model(round_index) if o.per_request else self.model_gamma()
        other = 0 if best > 0 else (o.max_gamma if o.per_request else self.best_drafting_gamma())
        untried = [] if o.per_request else [g for g in (best, other) if rate(g) is None]
        if o.per_request:               # the model decides; the other choice is probed now and then
            gamma = best
            if round_index >= self._next_probe and (other == 0 or self.could_pay(o.probe_margin)):
                gamma = other
                self._probes += 1
                self._next_probe = round_index + o.explore_every * 2 ** min(self._probes, 4)
        elif untried == [0] and self.rates.plain_ruled_out():
            gamma = best            # plain rounds could not keep up even priced at their cheapest
            self._next_probe = max(self._next_probe, round_index + o.explore_every)
        elif untried:       # a choice on trial keeps the rounds until they are timed (a switching round is
                            # not, and a model whose γ* flipped between 0 and 1 alternated untimed rounds)
            prev = self.clock.gammas.get(round_index - 1)
            gamma = prev if prev in untried else untried[0]
            self._next_probe = max(self._next_probe, round_index + o.explore_every)   # re-tries count from here
        elif self._hold is not None and round_index <= self._hold[1]:
            gamma = self._hold[0]       # a re-try runs until its rounds are timed (switch + lag + trial)
        else:                           # drafting must beat plain rounds by ``switch_margin`` (a switch
                                        # to drafting first reads the backlog, which no timed round shows)
            drafting, plain = (best, other) if best > 0 else (other, best)
            gamma = drafting if rate(drafting) > (1 + o.switch_margin) * rate(plain) else plain
            if round_index >= self._next_probe and not (gamma > 0 and self.rates.plain_ruled_out()):
                gamma = other if gamma == best else best              # re-try the other, less often each time
                self._probes += 1
                self._next_probe = round_index + o.explore_every * 2 ** min(self._probes, 4)
                self._hold = (gamma, round_index + o.trial)
        if not o.per_request and gamma > 0 and not self.clock.gammas.get(round_index - 1) \
                and not self.worth_starting(round_index):
            gamma = 0                   # starting to draft could not pay for the draft rows' backlog
        return gamma

    def _per_request_model(self, round_index: int) -> int:
        """``per_request``: the model's limit for this round. A "plain" answer is reused for up to
        ``recheck`` rounds while nothing could change it (no drafted round observed, the same number of live
        requests): in plain rounds the model's inputs move only with the passes' timing, and its computation
        (~1 ms a round, under the interpreter every request shares) is a visible share of a plain round at 8
        requests.
        """
        live = int(self.live())
        since, learned = self._plain_since, self.acceptance.learned
        if since is not None and since[1:] == (live, learned) and round_index - since[0] < self.options.recheck:
            return 0
        best = self.model_gamma()
        self._plain_since = (round_index, live, learned) if best == 0 else None
        return best

    def observe(self, drafted: int, accepted: int, round_index: int | None = None, confidences=None) -> None:
        """One request's round: ``drafted`` chain tokens, the first ``accepted`` of them accepted;
        ``confidences``: the draft's probability of each greedy token it drafted (the prior of
        :meth:`PooledAcceptance.pooled`), None for sampled chains."""
        with self._lock:
            self.acceptance.observe(drafted, accepted, confidences)
            if round_index is not None:
                self.clock.count(round_index, drafted, accepted)

    # ---------------------------------------------------------------- the parts' answers, by their old names
    def model_gamma(self) -> int:
        """The cost model's γ* (:meth:`BatchRates.model_gamma`)."""
        return self.rates.model_gamma()

    def best_drafting_gamma(self) -> int:
        return self.rates.best_drafting_gamma()

    def could_pay(self, margin: float = 1.0) -> bool:
        return self.rates.could_pay(margin)

    def worth_starting(self, round_index: int) -> bool:
        return self.rates.worth_starting(round_index)

    def alpha(self) -> np.ndarray:
        return self.acceptance.alpha()

    def _pooled(self) -> float:
        return self.acceptance.pooled()

    def round_overhead(self, live: int, draft, verify) -> tuple[float, float, float]:
        return self.clock.round_overhead(live, draft, verify)

    def _rate(self, gamma: int) -> float | None:
        return self.clock.rate(gamma)

    @property
    def rounds(self) -> dict[int, list[tuple[int, float, int]]]:
        return self.clock.rounds

    @property
    def _deciding(self) -> int:
        return self.clock.deciding

    def _ratio(self, priority: int, curve, shared: bool) -> float:
        return self.pricing.ratio(priority, curve, shared)

    def _scaled_costs(self):
        return self.pricing.scaled_costs()

    def _round_costs(self, live: int):
        return self.pricing.round_costs(live)

    def _verify_by_size(self, live: int, scaled):
        return self.pricing.verify_by_size(live, scaled)
