"""What a round costs on THIS machine, measured and kept honest while decoding.

``t(k)`` is the target's time to read k new tokens in one pass and ``d(k)`` the draft's; on CPUs
neither is constant in k, and both move between machines and moments (docs/models.md). So:

* :func:`measure_costs` times both models for k = 1..64 after a warm-up, ``repeats`` times each
  (interleaved over k), and keeps the median and the spread;
* a measurement of named models (a content identity, :class:`~specbound.models.base.ModelInfo`) is
  cached in ``<cache>/costs.json``, validated when read (a bad entry is dropped with a warning naming the
  file, and measured again); temporary models never write to it;
* :class:`CostModel` corrects the prior online from every round's passes (the run's recent median where
  it has seen k, the prior's shape at the run's level elsewhere). A prior off by more than
  ``stale_tolerance`` (25 %) is followed by the run and its cached entry dropped at the end
  (:meth:`CostModel.drop_if_stale`), so one busy-CPU calibration never steers decoding for good.
"""
from __future__ import annotations

import json
import math
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..assets.cache import atomic_write_json, cache_root
from ..errors import SpecboundError
from ..theory.speedup import CostProfile, perfect_draft_throughput, priced_draft_seconds, rows_pass_seconds

__all__ = ["COST_KS", "CostModel", "CostMeasurement", "costs_file", "load_or_measure_costs", "measure_costs",
           "perfect_draft_speedup",
           "pass_ratios",
           "measure_forward_costs", "read_cost_cache"]

COST_KS = (1, 2, 4, 8, 16, 32, 64)
# 3: entries that version 2 rewrote after a stale run could hold the run's optimistic guesses beyond the
# largest k it saw (then CostModel.persist); every machine measures once again rather than trust them
# 4: a stale run no longer writes its view into the cache (CostModel.drop_if_stale drops the entry): a
# stored kquant curve read 72.6 ms at t(1) where three fresh calibrations measured 34-42, so every entry a
# run may have written is measured once again
CACHE_VERSION = 4


#: A point whose repeats differ by more than this fraction of their median gets more reads.
NOISY_SPREAD = 0.3


def measure_forward_costs(model, ks=COST_KS, repeats: int = 3, token: int = 0) -> tuple[CostProfile, list[float]]:
    """Median seconds (and relative spread, (max − min)/median) for ``model`` to read k new tokens
    after its current cache; the cache is restored after every read.

    Repeats are interleaved over k (forward, then backward order), so a burst of outside load
    lasting a few reads lands on different k and one read per point at most, where the median
    discards it; a point still spread by more than ``NOISY_SPREAD`` gets up to ``repeats`` more
    reads (interleaved again) before its median is taken."""
    ks = tuple(int(k) for k in ks)
    if model.cache_length == 0:
        model.forward(torch.tensor([[token]], dtype=torch.long))
    base = model.cache_length
    times: dict[int, list[float]] = {k: [] for k in ks}

    def read(k: int) -> None:
        t0 = time.perf_counter()
        model.forward(torch.full((1, k), token, dtype=torch.long))
        times[k].append(time.perf_counter() - t0)
        model.crop(base)

    def spread(k: int) -> float:
        med = float(np.median(times[k]))
        return float((max(times[k]) - min(times[k])) / med) if med > 0 else 0.0

    for r in range(repeats):
        for k in (ks if r % 2 == 0 else ks[::-1]):
            read(k)
    for _ in range(repeats if repeats > 1 else 0):
        noisy = [k for k in ks if spread(k) > NOISY_SPREAD]
        if not noisy:
            break
        for k in noisy:
            read(k)
    return CostProfile(ks, tuple(float(np.median(times[k])) for k in ks)), [spread(k) for k in ks]


@dataclass
class CostMeasurement:
    """A calibration: target and draft profiles (median seconds per k) with their spreads."""

    target: CostProfile
    draft: CostProfile
    target_spread: list[float] = field(default_factory=list)
    draft_spread: list[float] = field(default_factory=list)
    source: str = "measured"           # "measured" now, or "cache" (read from costs.json)
    key: str | None = None
    seconds: float = 0.0               # wall time spent measuring (0 when read from the cache)

    def as_entry(self) -> dict:
        return {"target": {"ks": list(self.target.ks), "seconds": list(self.target.seconds),
                           "spread": self.target_spread},
                "draft": {"ks": list(self.draft.ks), "seconds": list(self.draft.seconds), "spread": self.draft_spread},
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": torch.get_num_threads()}


def measure_costs(target, draft, ks=COST_KS, repeats: int = 3) -> CostMeasurement:
    """Time target and draft reads of k tokens (warm-up first: first touches of weights page-fault)."""
    for model in (target, draft):
        if model is not None:
            measure_forward_costs(model, ks=(1, max(ks)), repeats=1)
    t_prof, t_spread = measure_forward_costs(target, ks, repeats)
    if draft is None:
        d_prof, d_spread = CostProfile((1,), (1e-9,)), [0.0]
    else:
        d_prof, d_spread = measure_forward_costs(draft, ks, repeats)
    return CostMeasurement(t_prof, d_prof, t_spread, d_spread)


# --------------------------------------------------------------------------------------------- cache
def costs_file() -> Path:
    return cache_root() / "costs.json"


def machine_name() -> str:
    """The CPU model (first ``model name`` of /proc/cpuinfo, else the platform's processor string): a
    cost curve measured on one kind of machine must not price decoding on another."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown"


def cost_key(target, draft) -> str | None:
    """Key from the models' content identities, kernels, the CPU model and the thread count; None =
    never cached."""
    models = [target] + ([draft] if draft is not None else [])
    if any(m.info.identity is None for m in models):
        return None
    parts = [f"{m.info.identity}:{m.info.kernels}" for m in models] + [f"cpu={machine_name()}",
                                                                        f"threads={torch.get_num_threads()}"]
    return "|".join(parts)


def _profile_from(entry) -> tuple[CostProfile, list[float]]:
    if not isinstance(entry, dict):
        raise ValueError("profile is not an object")
    ks, seconds = entry.get("ks"), entry.get("seconds")
    if not isinstance(ks, list) or not isinstance(seconds, list) or len(ks) != len(seconds) or not ks:
        raise ValueError("ks/seconds must be equal-length non-empty lists")
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in ks):
        raise ValueError("ks must be integers")
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0 for s in seconds):
        raise ValueError("seconds must be finite numbers > 0")
    spread = entry.get("spread") or [0.0] * len(ks)
    try:
        profile = CostProfile(tuple(ks), tuple(float(s) for s in seconds))
    except SpecboundError as exc:
        raise ValueError(str(exc)) from None
    return profile, [float(x) for x in spread][:len(ks)]


def read_cost_cache(path: Path | None = None) -> dict[str, CostMeasurement]:
    """Valid entries of the cost cache; anything malformed is dropped with a warning naming the file."""
    path = path or costs_file()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignoring unreadable cost cache {path} ({exc}); costs will be measured again", stacklevel=2)
        return {}
    if not isinstance(raw, dict) or raw.get("version") != CACHE_VERSION or not isinstance(raw.get("entries"), dict):
        warnings.warn(f"ignoring cost cache {path}: not a version-{CACHE_VERSION} specbound cost file; costs will be "
                      "measured again", stacklevel=2)
        return {}
    out = {}
    for key, entry in raw["entries"].items():
        try:
            if not isinstance(entry, dict):
                raise ValueError("entry is not an object")
            target, t_spread = _profile_from(entry.get("target"))
            draft, d_spread = _profile_from(entry.get("draft"))
        except ValueError as exc:
            warnings.warn(f"dropping a bad entry of the cost cache {path} ({exc}); it will be measured again",
                          stacklevel=2)
            continue
        out[key] = CostMeasurement(target, draft, t_spread, d_spread, source="cache", key=key)
    return out


def _write_cost_cache(entries: dict[str, CostMeasurement], path: Path | None = None) -> None:
    path = path or costs_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"version": CACHE_VERSION,
                                 "entries": {k: m.as_entry() for k, m in entries.items()}})
    except (OSError, SpecboundError) as exc:
        warnings.warn(f"could not write the cost cache {path} ({exc}); costs will be measured again next run",
                      stacklevel=2)


def drop_cached_costs(key: str) -> None:
    entries = read_cost_cache()
    if entries.pop(key, None) is not None:
        _write_cost_cache(entries)


def load_or_measure_costs(target, draft, use_cache: bool = True, repeats: int = 3, ks=COST_KS) -> CostMeasurement:
    """The cached calibration of this pair (validated), else a fresh measurement (cached when the
    models have a content identity)."""
    key = cost_key(target, draft) if use_cache else None
    if key is not None:
        cached = read_cost_cache().get(key)
        if cached is not None and max(cached.target.ks) >= max(ks) and max(cached.draft.ks) >= max(ks):
            return cached
    t0 = time.perf_counter()
    measured = measure_costs(target, draft, ks, repeats)
    measured.seconds = time.perf_counter() - t0
    measured.key = key
    if key is not None:
        entries = read_cost_cache()
        entries[key] = measured
        _write_cost_cache(entries)
    return measured


# --------------------------------------------------------------------------------------------- online
class _OnlineCurve:
    """A prior t(k) corrected by what the run observes."""

    def __init__(self, prior: CostProfile, window: int = 5):
        self.prior = prior
        self.obs: dict[int, deque] = {}
        self.window = window
        self.ratios: deque = deque(maxlen=16)     # observed / prior, recent
        self._seen = None

    def observe(self, k: int, seconds: float) -> None:
        if not (seconds > 0 and math.isfinite(seconds)) or k < 1:
            return
        self.obs.setdefault(k, deque(maxlen=self.window)).append(seconds)
        self.ratios.append(seconds / float(self.prior(k)))
        self._seen = None

    def _seen_curve(self) -> tuple[list[int], list[float]]:
        """Seen ks and their medians, made non-decreasing in k (a pass never gets cheaper with k)."""
        if getattr(self, "_seen", None) is None:
            seen = sorted((kk, float(np.median(v))) for kk, v in self.obs.items() if v)
            ks = [kk for kk, _ in seen]
            ts = list(np.minimum.accumulate([t for _, t in seen][::-1])[::-1]) if seen else []
            self._seen = (ks, ts)
        return self._seen

    def __call__(self, k: int) -> float:
        """The run's own median where it has seen k; between seen points linear interpolation of
        them; below them, the nearest seen point times the prior's ratio (the prior's shape, the
        run's level); above them, the lower of that and the run's own last slope — optimistic where
        unseen, so drafting goes there, measures, and corrects itself. With nothing seen: the prior."""
        k = int(k)
        ks, ts = self._seen_curve()
        if not ks:
            return float(self.prior(k))
        if k < ks[0]:
            return ts[0] * float(self.prior(k)) / float(self.prior(ks[0]))
        if k > ks[-1]:
            shaped = ts[-1] * float(self.prior(k)) / float(self.prior(ks[-1]))
            if len(ks) >= 2:     # optimistic where unseen: the run's own slope if it is flatter
                slope = max((ts[-1] - ts[-2]) / (ks[-1] - ks[-2]), 0.0)
                return min(shaped, ts[-1] + slope * (k - ks[-1]))
            return shaped
        return float(np.interp(k, ks, ts))

    def disagreement(self) -> float | None:
        """Median |observed/prior − 1| over recent observations (None until 4 are in)."""
        if len(self.ratios) < 4:
            return None
        return float(np.median(np.abs(np.asarray(self.ratios) - 1.0)))


def pass_ratios(records, curve: CostProfile, shared: bool) -> list[float]:
    """Measured / predicted seconds of a batch's passes (``PassRecord``s of one model): each pass over
    ``rows`` rows reading ``tokens`` tokens in all, priced by ``curve`` as
    :func:`~specbound.theory.speedup.rows_pass_seconds` prices it (one shared forward, or rows in turn)."""
    kept = [p for p in records if p.tokens > 0 and p.rows > 0]
    if not kept:
        return []
    rows = np.array([p.rows for p in kept], dtype=np.float64)
    tokens = np.array([p.tokens for p in kept], dtype=np.float64)
    seconds = np.array([p.seconds for p in kept], dtype=np.float64)
    # one vectorised pricing of every pass (the batch policy reads this every round, under the
    # interpreter its requests share)
    return (seconds / rows_pass_seconds(curve, rows, tokens / rows, shared)).tolist()


class CostModel:
    """Target pass t(k) and draft pass d(k), priors from a calibration, corrected online."""

    def __init__(self, measurement: CostMeasurement, stale_tolerance: float = 0.25):
        self.measurement = measurement
        self.target = _OnlineCurve(measurement.target)
        self.draft = _OnlineCurve(measurement.draft)
        self.stale_tolerance = stale_tolerance
        self.stale = False

    @classmethod
    def constant(cls, target_seconds: float = 1.0, draft_seconds: float = 0.0) -> "CostModel":
        """Yin et al.'s Assumption 1: a pass costs the same for any k; drafting is (nearly) free."""
        return cls(CostMeasurement(CostProfile((1,), (target_seconds,)),
                                   CostProfile((1,), (max(draft_seconds, 1e-9),)), source="assumed"))

    def observe_target(self, k: int, seconds: float) -> None:
        self.target.observe(k, seconds)
        self._check_stale()

    def observe_draft(self, k: int, seconds: float) -> None:
        self.draft.observe(k, seconds)

    _warned: set = set()       # profiles already reported stale in this process (a batch's requests each hold a model)

    def _check_stale(self) -> None:
        off = self.target.disagreement()
        if not self.stale and off is not None and off > self.stale_tolerance:
            self.stale = True
            name = self.measurement.key or self.measurement.source
            if name in CostModel._warned:
                return
            CostModel._warned.add(name)
            then = (", and the cached profile is dropped at the end of the run (the next run measures again)"
                    if self.measurement.key else "")
            warnings.warn(f"the cost profile ({self.measurement.source}) disagrees with this run by {off:.0%} "
                          f"(median): decoding follows the run's own measurements{then}", stacklevel=3)

    def drop_if_stale(self) -> None:
        """At the end of a run whose calibration proved stale: drop the cached entry, so the next run
        measures the pair again (interleaved repeats, a few seconds) instead of trusting either the old
        calibration or this run's view. Why not store the run's corrected curves (the design until
        2026-12-06): a run sees a few pass sizes at one moment of a machine whose speed drifts by a third
        within minutes; stored and corrected run after run, such an entry drifted to twice the measured cost.
        """
        key = self.measurement.key
        if self.stale and key:
            drop_cached_costs(key)


def perfect_draft_speedup(costs: CostModel, max_gamma: int = 32, context_share: float = 0.0) -> tuple[int, float]:
    """The most chains drafted at this pair's cost could give one request, as a speed-up over plain
    decoding at t(1): every drafted token accepted, one draft read d(1) per depth (a round's first read
    re-reads the bonus token too, so real rounds cost at least this), one target pass t(γ + 1) —
    :func:`~specbound.theory.speedup.perfect_draft_throughput` at B = 1 on the run's own curves (the
    calibration as corrected by the passes the run timed). ``context_share``: the share of drafted tokens
    found in the context, priced at no draft read (:func:`~specbound.theory.speedup.priced_draft_seconds`).
    No drafter of this cost and mix exceeds it; returns (γ, speed-up), (0, 1.0) when not even a perfect
    draft pays."""
    ks = costs.measurement.target.ks
    verify = CostProfile(tuple(ks), tuple(float(costs.target(k)) for k in ks))
    d1 = float(costs.draft(1))
    gamma, rate = perfect_draft_throughput(1, priced_draft_seconds(d1, max_gamma, context_share), verify)
    return gamma, rate * float(verify(1))
