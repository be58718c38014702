"""Choosing the draft length γ from the cost model (theory/speedup.py) and what the run has seen.

:class:`AdaptiveGamma` keeps positional acceptance counts (with a weak prior), the measured
draft cost per token and the target's measured t(k), and before every round picks the γ with the
largest predicted speed-up — γ = 0 (a plain target step) when speculation is predicted to lose. It
changes only *how many* tokens are drafted, never how they are verified, so the output law is
untouched.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import SpecboundError
from ..theory.speedup import CostProfile, best_gamma

__all__ = ["AdaptiveGamma", "measure_forward_costs"]


def measure_forward_costs(model, ks=(1, 2, 4, 8, 16), repeats: int = 3, token: int = 0) -> CostProfile:
    """Median seconds for ``model`` to read k new tokens after its current cache (cache restored)."""
    base = model.cache_length
    if base == 0:
        model.forward(torch.tensor([[token]], dtype=torch.long))
        base = 1
    seconds = []
    for k in ks:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.forward(torch.full((1, k), token, dtype=torch.long))
            times.append(time.perf_counter() - t0)
            model.crop(base)
        seconds.append(float(np.median(times)))
    return CostProfile(tuple(int(k) for k in ks), tuple(seconds))


class AdaptiveGamma:
    """Per-round γ from E[tokens](α̂, γ)·t(1) / (γ·ĉ + t̂(γ+1)) (see :func:`theory.speedup.best_gamma`).

    α̂ pools all draft positions (the i.i.d. model of Leviathan et al.), ĉ is the measured seconds
    per drafted token and t̂(k) the measured target pass over k tokens, both updated every round.
    """

    def __init__(self, verify_cost: CostProfile, draft_cost: float, max_gamma: int = 12,
                 prior_alpha: float = 0.7, prior_weight: float = 4.0, probe_every: int = 8,
                 probe_gamma: int = 4, min_gain: float = 1.02, memory: float = 0.9):
        if max_gamma < 1:
            raise SpecboundError("max_gamma must be >= 1")
        self.max_gamma, self.min_gain = max_gamma, min_gain
        self.probe_every, self.probe_gamma = probe_every, probe_gamma
        self.verify_points = dict(zip(verify_cost.ks, verify_cost.seconds))
        self.draft_cost = float(draft_cost)
        self.prior_alpha, self.prior_weight, self.memory = prior_alpha, prior_weight, memory
        self.accepted, self.reached = 0.0, 0.0
        self.plain_steps = 0
        self.history: list[int] = []

    @classmethod
    def calibrate(cls, target, draft, use_cache: bool = True, **kwargs) -> "AdaptiveGamma":
        """Measure the target's t(k) and the draft's per-token cost (caches restored).

        Measurements of named real models are remembered in ``$SPECBOUND_CACHE/costs.json`` (keyed by
        model, linear backend and thread count) so later runs skip them; the online updates in
        :meth:`observe` correct any drift.
        """
        key = _cost_key(target, draft)
        cached = _read_costs().get(key) if (use_cache and key) else None
        if cached:
            return cls(CostProfile(tuple(cached["ks"]), tuple(cached["seconds"])), cached["draft"], **kwargs)
        for model in (target, draft):     # warm-up: first touches of the weights are page faults
            measure_forward_costs(model, ks=(1,), repeats=1)
        verify = measure_forward_costs(target, ks=(1, 2, 4, 8), repeats=2)
        draft_cost = measure_forward_costs(draft, ks=(1,), repeats=2).seconds[0]
        if use_cache and key:
            costs = _read_costs()
            costs[key] = {"ks": list(verify.ks), "seconds": list(verify.seconds), "draft": draft_cost}
            _write_costs(costs)
        return cls(verify, draft_cost, **kwargs)

    @property
    def alpha(self) -> float:
        """Acceptance rate: recent verified positions (counts decay by ``memory`` per round, so the
        estimate follows easy and hard stretches of text) plus a weak Beta prior."""
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.reached + self.prior_weight)

    @property
    def verify_cost(self) -> CostProfile:
        ks = sorted(self.verify_points)
        return CostProfile(tuple(ks), tuple(self.verify_points[k] for k in ks))

    def choose(self, remaining: int) -> int:
        gamma, _ = best_gamma(self.alpha, self.draft_cost, self.verify_cost, self.max_gamma, self.min_gain)
        if gamma == 0:
            self.plain_steps += 1
            if self.probe_every and self.plain_steps % self.probe_every == 0:
                gamma = self.probe_gamma          # keep learning α while decoding plainly
        gamma = min(gamma, remaining)
        self.history.append(gamma)
        return gamma

    def observe(self, drafted: int, accepted: int, seconds_per_draft_token: float | None,
                target_seconds: float) -> None:
        """Update α̂ (positional counts), the draft cost per token and t̂(drafted + 1)."""
        self.reached = self.memory * self.reached + min(accepted + 1, drafted)
        self.accepted = self.memory * self.accepted + accepted
        if seconds_per_draft_token is not None:
            self.draft_cost = 0.8 * self.draft_cost + 0.2 * seconds_per_draft_token
        k = drafted + 1
        old = self.verify_points.get(k)
        self.verify_points[k] = target_seconds if old is None else 0.8 * old + 0.2 * target_seconds


def _costs_file() -> Path:
    root = os.environ.get("SPECBOUND_CACHE") or Path.home() / ".cache" / "specbound"
    return Path(root) / "costs.json"


def _cost_key(target, draft) -> str | None:
    """Cost-cache key from the models' content identities; None (never cached) for models without one."""
    if target.info.identity is None or draft.info.identity is None:
        return None
    parts = [target.info.identity, target.info.kernels, draft.info.identity, draft.info.kernels,
             f"threads={torch.get_num_threads()}"]
    return "|".join(parts)


def _read_costs() -> dict:
    try:
        return json.loads(_costs_file().read_text())
    except (OSError, ValueError):
        return {}


def _write_costs(costs: dict) -> None:
    path = _costs_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(costs, indent=1))
        tmp.replace(path)
    except OSError:
        pass
