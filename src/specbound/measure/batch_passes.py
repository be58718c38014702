"""What B rows of a batch really cost, measured through the engine's batched loop.

A single row's cost curve t(k) misprices a batch: B rows reading one token each are not one row
reading B tokens (every row attends over its own cache, with its own cache writes and mask, inside
the shared pass), and every round has work outside the passes that grows with B (each request's
sampling, verification and scheduling share one interpreter). :func:`measure_batch_passes` runs
plain batched decoding and a drafted chain of fixed length at each batch size on calibration
prompts and reads, from the scheduler's pass records,

* the ratio of the measured passes to what the single-row curves predict for them
  (:func:`~specbound.theory.speedup.rows_pass_seconds`), target and draft apart;
* the seconds per round outside the passes, for a plain round and for a drafted one.

``advise --batch`` prices batch sizes with them (the batch policy corrects its prior the same way,
online: :class:`~specbound.decoding.policy.BatchDraftLength`).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..errors import SpecboundError
from ..theory.speedup import CostProfile, rows_pass_seconds

__all__ = ["BatchPassCosts", "measure_batch_passes"]


@dataclass(frozen=True)
class BatchPassCosts:
    """One batch size B: measured / predicted pass seconds (target, draft), and seconds per round
    outside the passes (plain round, drafted round of ``gamma``)."""

    batch: int
    target_ratio: float
    draft_ratio: float
    plain_work: float
    drafted_work: float
    gamma: int
    rounds: int                      # decode rounds the figures come from (plain + drafted)


def _ratio(records, curve: CostProfile, shared: bool, max_tokens_per_row: int) -> list[float]:
    """Measured / predicted seconds of the decode passes among ``records`` (prompt reads left out:
    they read more than ``max_tokens_per_row`` tokens per row)."""
    out = []
    for p in records:
        if p.rows > 0 and 0 < p.tokens <= p.rows * max_tokens_per_row:
            out.append(p.seconds / float(rows_pass_seconds(curve, p.rows, p.tokens / p.rows, shared)))
    return out


def _decode_part(result, gamma: int):
    """(decode passes of the target, decode passes of the draft, seconds after the prefill) of a batch."""
    passes = result.passes
    target = [p for p in passes if p.priority >= 1 and 0 < p.tokens <= p.rows * (gamma + 1)]
    draft = [p for p in passes if p.priority == 0 and 0 < p.tokens <= p.rows * (gamma + 1)]
    return target, draft, result.wall_time - result.prefill_time


def measure_batch_passes(target, draft, prompt_ids: list[list[int]], batches, costs, rows_shared=(True, True),
                         gamma: int = 4, tokens: int = 32, context: int | None = None, progress=None) -> dict[int, BatchPassCosts]:
    """Per batch size B: plain batched decoding and chains of ``gamma`` (greedy, ``tokens`` new tokens
    per request) of B calibration prompts (cycled; each cut to its last ``context`` tokens, so the
    prompt reads stay short), timed by the batch's own pass records against ``costs`` (a
    :class:`~specbound.decoding.costs.CostMeasurement` of one row). ``rows_shared`` (draft, target):
    whether each model's rows share one pass (:func:`~specbound.decoding.batch.rows_shared`)."""
    from ..decoding.batch import autoregressive_decode_batch, speculative_decode_batch
    from .records import Stage

    if not prompt_ids:
        raise SpecboundError("measure_batch_passes needs at least one calibration prompt")
    if gamma < 1 or tokens < 2 or (context is not None and context < 2):
        raise SpecboundError("measure_batch_passes needs gamma >= 1, tokens >= 2 and context >= 2 (or None)")
    draft_shared, target_shared = (bool(x) for x in rows_shared)
    out = {}
    stage = Stage(progress, "batched passes", len(batches))
    for B in batches:
        prompts = [list(prompt_ids[i % len(prompt_ids)])[-(context or 0):] for i in range(int(B))]
        plain = autoregressive_decode_batch(target, prompts, tokens, temperature=0.0)
        sd = speculative_decode_batch(target, draft, prompts, tokens, gamma=gamma, temperature=0.0)
        p_target, _, p_seconds = _decode_part(plain, 0)
        s_target, s_draft, s_seconds = _decode_part(sd, gamma)
        ratios = _ratio(p_target, costs.target, target_shared, 1) + _ratio(s_target, costs.target, target_shared,
                                                                           gamma + 1)
        draft_ratios = _ratio(s_draft, costs.draft, draft_shared, 1)
        plain_work = (p_seconds - sum(p.seconds for p in p_target)) / max(len(p_target), 1)
        drafted_work = (s_seconds - sum(p.seconds for p in s_target) - sum(p.seconds for p in s_draft)) \
            / max(len(s_target), 1)
        out[int(B)] = BatchPassCosts(batch=int(B), target_ratio=statistics.median(ratios) if ratios else 1.0,
                                     draft_ratio=statistics.median(draft_ratios) if draft_ratios else 1.0,
                                     plain_work=max(plain_work, 0.0), drafted_work=max(drafted_work, 0.0),
                                     gamma=int(gamma), rounds=len(p_target) + len(s_target))
        stage.advance()
    return out
