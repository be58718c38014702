"""The acceptance a pair has shown, kept between runs: what a batch prices its first drafted round with.

A batch that starts to draft first makes every draft row read its backlog (at the start, every prompt);
whether that pays depends on an acceptance the batch has not yet seen. Priced at FULL acceptance (an
upper bound) the decision sat on a knife edge, and a 4-request batch that started lost 20% to plain
decoding (int8 target, GSM8K 133-140, 2026-12-07; docs/results/HISTORY.md). So every drafted CHAIN run
of a named pair (lossless rules only) adds its per-depth counts — tokens tested and accepted at depth i
(:class:`~specbound.decoding.result.DecodeMetrics`'s ``position_reached`` / ``position_accepted``) — to
``<cache>/acceptance.json``, the older counts weighted by ``FORGET`` each time.

Keyed by the two models' content identities and kernels and the sampling law (greedy, or T / top-k /
top-p with the verification rule); temporary models are never remembered. The file is validated when
read: a bad entry is dropped with a warning naming the file, and rewritten by the next run.
"""
from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..assets.cache import atomic_write_json, cache_root
from ..errors import SpecboundError

__all__ = ["ShownAcceptance", "acceptance_file", "acceptance_key", "pooled_greedy_acceptance", "read_acceptance",
           "remember_acceptance",
           "shrunk_acceptance"]

ACCEPTANCE_VERSION = 1
#: weight of the stored counts when a run adds its own (per run, so ~the last few runs dominate)
FORGET = 0.5
#: depths kept (chains are at most this long; deeper counts are dropped)
MAX_DEPTH = 64


def shrunk_acceptance(accepted, reached, pooled: float, shrinkage: float) -> np.ndarray:
    """Acceptance per depth, (accepted_i + s·ā) / (reached_i + s): each depth's own rate shrunk toward ā,
    the acceptance over all depths, with weight s observations; a depth never reached gets ā."""
    return (np.asarray(accepted, dtype=np.float64) + shrinkage * pooled) / (np.asarray(reached, dtype=np.float64)
                                                                            + shrinkage)


@dataclass(frozen=True)
class ShownAcceptance:
    """Per-depth counts a pair has shown: ``reached[i]`` drafted tokens tested at depth i + 1 and
    ``accepted[i]`` of them accepted."""

    accepted: tuple[float, ...]
    reached: tuple[float, ...]

    def per_depth(self, depths: int, shrinkage: float = 2.0) -> np.ndarray:
        """α_i for i = 1..``depths``: :func:`shrunk_acceptance` with ā under Beta(1, 1) over all depths (the
        estimator :meth:`~specbound.decoding.policy.BatchDraftLength.alpha` uses for a run's own counts)."""
        acc = np.zeros(depths)
        reach = np.zeros(depths)
        n = min(depths, len(self.reached))
        acc[:n], reach[:n] = self.accepted[:n], self.reached[:n]
        pooled = (sum(self.accepted) + 1.0) / (sum(self.reached) + 2.0)        # Beta(1, 1)
        return shrunk_acceptance(acc, reach, pooled, shrinkage)


def acceptance_file() -> Path:
    return cache_root() / "acceptance.json"


def acceptance_key(target, draft, sampling, verification: str = "token") -> str | None:
    """The pair's identities and kernels and the sampling law; None (never remembered) where either model
    has no content identity. At T = 0 the verification rule does not change the accepted tokens."""
    if draft is None or target.info.identity is None or draft.info.identity is None:
        return None
    law = "greedy" if sampling.greedy else f"{sampling.describe()}|{verification}"
    return "|".join([f"{m.info.identity}:{m.info.kernels}" for m in (target, draft)] + [law])


def _counts(value, name: str) -> list[float]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_DEPTH:
        raise ValueError(f"{name} must be a list of 1 to {MAX_DEPTH} counts")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in value):
        raise ValueError(f"{name} must hold finite counts >= 0")
    return [float(x) for x in value]


def _entry(raw) -> ShownAcceptance:
    if not isinstance(raw, dict):
        raise ValueError("entry is not an object")
    accepted, reached = _counts(raw.get("accepted"), "accepted"), _counts(raw.get("reached"), "reached")
    if len(accepted) != len(reached):
        raise ValueError("accepted and reached differ in length")
    if any(a > r * (1 + 1e-9) + 1e-9 for a, r in zip(accepted, reached)):
        raise ValueError("more accepted than reached at some depth")
    if any(r1 > r0 * (1 + 1e-9) + 1e-9 for r0, r1 in zip(reached, reached[1:])):
        raise ValueError("a deeper depth reached more often than a shallower one")
    return ShownAcceptance(tuple(accepted), tuple(reached))


def _read_all(path: Path) -> dict[str, ShownAcceptance]:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignoring unreadable acceptance memory {path} ({exc}); the next run rewrites it", stacklevel=3)
        return {}
    if not isinstance(raw, dict) or raw.get("version") != ACCEPTANCE_VERSION or not isinstance(raw.get("entries"), dict):
        warnings.warn(f"ignoring acceptance memory {path}: not a version-{ACCEPTANCE_VERSION} specbound file; the "
                      "next run rewrites it", stacklevel=3)
        return {}
    out = {}
    for key, entry in raw["entries"].items():
        try:
            out[key] = _entry(entry)
        except ValueError as exc:
            warnings.warn(f"dropping a bad entry of the acceptance memory {path} ({exc})", stacklevel=3)
    return out


def read_acceptance(key: str | None, path: Path | None = None) -> ShownAcceptance | None:
    """The counts remembered for ``key`` (validated), or None."""
    if key is None:
        return None
    return _read_all(path or acceptance_file()).get(key)


def pooled_greedy_acceptance(target_identity: str | None, draft_identity: str | None, path: Path | None = None,
                             min_reached: float = 20.0) -> float | None:
    """The greedy acceptance (accepted over tested drafted tokens, all depths) a pair has shown under any
    kernels of its two models, by content identity — every K-quant kernel path gives the same bits, so
    the same acceptance — or None with fewer than ``min_reached`` tested tokens remembered."""
    if target_identity is None or draft_identity is None:
        return None
    accepted = reached = 0.0
    for key, shown in _read_all(path or acceptance_file()).items():
        parts = key.split("|")
        if len(parts) == 3 and parts[2] == "greedy" and parts[0].startswith(target_identity + ":") \
                and parts[1].startswith(draft_identity + ":"):
            accepted, reached = accepted + sum(shown.accepted), reached + sum(shown.reached)
    return accepted / reached if reached >= min_reached else None


def remember_acceptance(key: str | None, metrics, path: Path | None = None) -> None:
    """Add the per-depth counts of ``metrics`` (DecodeMetrics of one run's requests) to ``key``'s entry,
    the stored counts weighted by ``FORGET``. Nothing is written for ``key`` None or a run that drafted
    nothing; a file that cannot be written is left with a warning (the memory is an optimisation)."""
    if key is None:
        return
    depth = min(max((len(m.position_reached) for m in metrics), default=0), MAX_DEPTH)
    reached, accepted = np.zeros(depth), np.zeros(depth)
    for m in metrics:
        n = min(len(m.position_reached), depth)
        reached[:n] += m.position_reached[:n]
        accepted[:n] += m.position_accepted[:n]
    if depth == 0 or reached.sum() == 0:
        return
    path = path or acceptance_file()
    entries = _read_all(path)
    old = entries.get(key)
    if old is not None:
        n = max(depth, len(old.reached))
        reached, accepted = np.pad(reached, (0, n - depth)), np.pad(accepted, (0, n - depth))
        reached[:len(old.reached)] += FORGET * np.asarray(old.reached)
        accepted[:len(old.accepted)] += FORGET * np.asarray(old.accepted)
    entries[key] = ShownAcceptance(tuple(accepted.tolist()), tuple(reached.tolist()))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"version": ACCEPTANCE_VERSION, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                 "entries": {k: {"accepted": list(e.accepted), "reached": list(e.reached)}
                                             for k, e in entries.items()}})
    except (OSError, SpecboundError) as exc:
        warnings.warn(f"could not write the acceptance memory {path} ({exc})", stacklevel=2)
