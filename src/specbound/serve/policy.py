"""Whether requests that wait together should share passes, or run one after another.

Sharing pays when the target's rows read in ONE forward (one weight read for all of them) and, where
the pair's costs were measured, when a pass over two rows' tokens costs less than two passes over
one: t(2) < 2·t(1) (:func:`~specbound.theory.speedup.rows_pass_seconds`). The server reports the
choice and its reason in its log and metrics.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..decoding.batch import rows_shared
from ..errors import SpecboundError
from ..theory.speedup import rows_pass_seconds

__all__ = ["BATCHING_MODES", "BatchingChoice", "choose_batching"]

BATCHING_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class BatchingChoice:
    """``batched``: requests join a shared pass schedule (up to ``max_batch`` at once); else one at a time."""

    batched: bool
    reason: str

    @property
    def mode(self) -> str:
        return "continuous" if self.batched else "sequential"


def choose_batching(target, draft, *, mode: str = "auto", measurement=None) -> BatchingChoice:
    """The batching of a server over this pair: ``mode`` "on"/"off" as told (where the backend can),
    "auto" from the rows' sharing and, when given, the measured t(k) (a CostMeasurement)."""
    if mode not in BATCHING_MODES:
        raise SpecboundError(f"batching must be one of {', '.join(BATCHING_MODES)}, got {mode!r}")
    if mode == "off":
        return BatchingChoice(False, "batching off (as asked)")
    if not target.supports_batches or (draft is not None and not draft.supports_batches):
        return BatchingChoice(False, f"{target.name} has no rows of its own for concurrent requests")
    if mode == "on":
        return BatchingChoice(True, "batching on (as asked)")
    draft_shared, target_shared = rows_shared(target, draft)
    if not target_shared:
        return BatchingChoice(False, "the target's rows read one after another: sharing passes gains nothing")
    if measurement is not None:
        two = float(rows_pass_seconds(measurement.target, 2, 1, True))
        one = float(measurement.target(1))
        if two >= 2 * one:
            return BatchingChoice(False, f"a pass over 2 rows costs {two * 1e3:.1f} ms, no less than 2 passes "
                                         f"over 1 ({2 * one * 1e3:.1f} ms)")
        return BatchingChoice(True, f"a pass over 2 rows costs {two * 1e3:.1f} ms vs {2 * one * 1e3:.1f} ms for "
                                    "2 passes over 1" + ("" if draft_shared else "; draft rows read in turn"))
    return BatchingChoice(True, "the target's rows share passes")
