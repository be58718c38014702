"""What B rows of a batch really cost, measured through the engine's batched loop.

A single row's cost curve t(k) misprices a batch: B rows reading one token each are not one row
reading B tokens (every row attends over its own cache, with its own cache writes and mask, inside the
shared pass), and every round has work outside the passes that grows with B (each request's sampling,
verification and scheduling share one interpreter). :func:`measure_batch_passes` runs plain batched
decoding and a drafted chain of fixed length at each batch size on calibration prompts and reads, from
the scheduler's pass records, the ratio of the target's passes to what its one-row curve predicts
(:func:`~specbound.theory.speedup.rows_pass_seconds`), the draft's seconds per drafted round at two chain
lengths (its first read re-reads every row's accepted backlog, so a round is not γ one-token reads) and
the seconds per round outside the passes, plain and drafted. ``advise --batch`` prices batch sizes with
them (the batch policy corrects its prior the same way, online:
:class:`~specbound.decoding.batch_policy.BatchDraftLength`).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..errors import SpecboundError
from ..decoding import batch as batched_decoding   # a module: its functions are looked up when called
from ..decoding.costs import pass_ratios
from .records import Stage

__all__ = ["BatchPassCosts", "measure_batch_passes", "prompt_at_context"]


@dataclass(frozen=True)
class BatchPassCosts:
    """One batch size B, measured: the target's passes as a ratio to the one-row curve, and per round
    the seconds outside the passes (plain round: ``plain_work``) and, for chains of the two calibrated
    lengths ``gammas``, the draft's passes (``draft_round``) and the work outside the passes
    (``drafted_work``). A drafted round's draft seconds and work at another γ lie on the line through
    the two (:meth:`draft_seconds`, :meth:`work`): its first draft read re-reads the accepted backlog of
    every row, the rest one token per row, so neither is γ times a one-token read."""

    batch: int
    target_ratio: float
    plain_work: float
    gammas: tuple[int, int]
    draft_round: tuple[float, float]
    drafted_work: tuple[float, float]
    rounds: int                      # decode rounds the figures come from (plain + drafted)

    @staticmethod
    def _line(gammas, values, gamma: float) -> float:
        (g1, g2), (v1, v2) = gammas, values
        slope = (v2 - v1) / (g2 - g1) if g2 != g1 else 0.0
        return v1 + slope * (gamma - g1)

    def draft_seconds(self, gamma: int) -> float:
        """Seconds of the draft's passes in a round that drafts γ tokens per request (≥ 0; 0 at γ = 0)."""
        return max(self._line(self.gammas, self.draft_round, gamma), 0.0) if gamma > 0 else 0.0

    def work(self, gamma: int) -> float:
        """Seconds per round outside the passes: ``plain_work`` at γ = 0, else the drafted line (≥ 0)."""
        return max(self._line(self.gammas, self.drafted_work, gamma), 0.0) if gamma > 0 else self.plain_work


def _decode_part(result, gamma: int):
    """(decode passes of the target, decode passes of the draft, seconds of the rounds) of a batch: prompt
    reads left out (they read more than γ + 1 tokens per row) — the target's are its prefill, the draft's
    come in the first drafted round (a batch's drafters read their prompts there) and are taken out of the
    rounds' seconds here, as a one-time cost the per-round figures do not describe."""
    passes = result.passes
    target = [p for p in passes if p.priority >= 1 and 0 < p.tokens <= p.rows * (gamma + 1)]
    draft = [p for p in passes if p.priority == 0 and 0 < p.tokens <= p.rows * (gamma + 1)]
    prompt_reads = sum(p.seconds for p in passes if p.priority == 0 and p.tokens > p.rows * (gamma + 1))
    return target, draft, result.wall_time - result.prefill_time - prompt_reads


def prompt_at_context(prompt_ids: list[list[int]], index: int, context: int | None) -> list[int]:
    """Calibration prompt ``index`` as it is (``context`` None), cut to its last ``context`` tokens, or
    extended to ``context`` tokens by the tokens of the prompts before it (cyclically, its own end kept
    last): what a pass costs depends on how many tokens the rows have cached, not on which."""
    prompt = list(prompt_ids[index])
    if context is None:
        return prompt
    others = [t for j in range(len(prompt_ids), 0, -1) for t in prompt_ids[(index - j) % len(prompt_ids)]]
    while len(prompt) < context:
        prompt = others[len(others) - min(context - len(prompt), len(others)):] + prompt
    return prompt[-context:]


def measure_batch_passes(target, draft, prompt_ids: list[list[int]], batches, costs, rows_shared=(True, True),
                         gammas: tuple[int, int] = (2, 6), tokens: int = 32, context: int | None = None,
                         progress=None) -> dict[int, BatchPassCosts]:
    """Per batch size B: plain batched decoding and chains of each of the two lengths ``gammas``
    (greedy, ``tokens`` new tokens per request) of B calibration prompts (cycled; whole, or brought to
    exactly ``context`` tokens, :func:`prompt_at_context`: a pass over B rows costs more as their caches
    grow — measured at 8 rows, 48-token prompts decoded 60–67 tok/s where 121–209-token ones decoded
    51–55; at 4 rows × 1 token, kquant, 60 / 66 / 77 / 93 ms at 32 / 128 / 256 / 512 cached tokens — so
    advise calibrates at the context it predicts for), timed by the batch's own pass records against
    ``costs`` (a :class:`~specbound.decoding.costs.CostMeasurement` of one row). ``rows_shared``
    (draft, target): whether the target's rows share one pass (:func:`~specbound.decoding.batch.rows_shared`)."""
    if not prompt_ids:
        raise SpecboundError("measure_batch_passes needs at least one calibration prompt")
    gammas = tuple(int(g) for g in gammas)
    if len(gammas) != 2 or min(gammas) < 1 or gammas[0] == gammas[1] or tokens < 2 \
            or (context is not None and context < 2):
        raise SpecboundError("measure_batch_passes needs two different chain lengths >= 1, tokens >= 2 and "
                             "context >= 2 (or None)")
    target_shared = bool(rows_shared[1])
    out = {}
    stage = Stage(progress, "batched passes", len(batches))
    for B in batches:
        prompts = [prompt_at_context(prompt_ids, i % len(prompt_ids), context) for i in range(int(B))]
        plain = batched_decoding.autoregressive_decode_batch(target, prompts, tokens, temperature=0.0)
        p_target, _, p_seconds = _decode_part(plain, 0)
        ratios = pass_ratios(p_target, costs.target, target_shared)
        rounds, draft_round, work = len(p_target), [], []
        for g in gammas:
            sd = batched_decoding.speculative_decode_batch(target, draft, prompts, tokens, gamma=g, temperature=0.0)
            s_target, s_draft, s_seconds = _decode_part(sd, g)
            n = max(len(s_target), 1)
            ratios += pass_ratios(s_target, costs.target, target_shared)
            drafted = sum(p.seconds for p in s_draft)
            draft_round.append(drafted / n)
            work.append(max(s_seconds - sum(p.seconds for p in s_target) - drafted, 0.0) / n)
            rounds += len(s_target)
        plain_work = (p_seconds - sum(p.seconds for p in p_target)) / max(len(p_target), 1)
        out[int(B)] = BatchPassCosts(batch=int(B), target_ratio=statistics.median(ratios) if ratios else 1.0,
                                     plain_work=max(plain_work, 0.0), gammas=gammas,
                                     draft_round=tuple(draft_round), drafted_work=tuple(work), rounds=rounds)
        stage.advance()
    return out
