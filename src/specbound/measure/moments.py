"""Surprisal moments μ, μ₂ of a model on its own samples (Pankratov & Alistarh 2026, §3.4; nats).

Continuations are sampled by the engine (plain decoding: :class:`~specbound.decoding.Speculator`
with no drafter) at the given temperature, no top-k/top-p, stopping after a stop token; then ONE
forward pass over prompt + continuation gives the model's law before every generated token, whose
H = −Σ p ln p and m2 = Σ p ln² p are computed by :func:`specbound.theory.estimate_moments`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..decoding import STANDARD, PlainDrafter, SamplingConfig, Speculator, make_generator
from ..errors import SpecboundError
from ..models.tokens import stop_token_ids
from ..theory.bounds import estimate_moments
from .journal import PartialResults, no_journal
from .records import Stage
from .stats import mean_se

__all__ = ["MomentSample", "Moments", "MomentsMeasurement", "aggregate_moments", "measure_moments",
           "sample_with_moments"]


@dataclass
class MomentSample:
    """One sampled continuation and H, m2 of the model's law before each of its tokens."""

    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    H: list[float] = field(default_factory=list)
    m2: list[float] = field(default_factory=list)


@dataclass
class Moments:
    """Pooled μ = mean H, μ₂ = mean Σ p ln² p, E[H²], Var(Y) = μ₂ − μ² over n positions; SEs per
    position (``se_mu``) and across prompts (``se_mu_prompt``: positions of one sample correlate)."""

    mu: float
    mu2: float
    mean_H2: float
    var_surprisal: float
    n: int
    se_mu: float
    se_mu2: float
    se_mu_prompt: float = float("nan")
    se_mu2_prompt: float = float("nan")
    n_prompts: int = 0
    std_H: float = float("nan")
    frac_H_below_0p1: float = float("nan")
    model: str = ""
    temperature: float = 1.0
    seconds: float = 0.0
    tokens_per_prompt: int = 0
    prompts: int = 0


@dataclass
class MomentsMeasurement:
    estimate: Moments
    samples: list[MomentSample] = field(default_factory=list)


def sample_with_moments(model, prompt_ids: list[int], n_tokens: int, temperature: float,
                        generator: torch.Generator, stop_ids=()) -> MomentSample:
    """Sample up to ``n_tokens`` from ``model`` at ``temperature`` through the engine (ending after a
    stop token) and return them with H and m2 of the model's tempered law before each token."""
    prompt_ids = [int(t) for t in prompt_ids]
    if n_tokens <= 0:
        return MomentSample(prompt_ids, [], [], [])
    sampling = SamplingConfig(float(temperature))
    engine = Speculator(model, PlainDrafter(sampling), sampling, STANDARD, stop_ids, generator)
    tokens = engine.run(prompt_ids, n_tokens).tokens
    model.reset()
    seq = prompt_ids + tokens[:-1]
    logits = model.forward(torch.tensor([seq], dtype=torch.long))[0, len(prompt_ids) - 1:].double().numpy()
    model.reset()
    H, m2 = [], []
    for row in logits:
        est = estimate_moments(row[None], temperature=temperature, from_logits=True)
        H.append(est.mu)
        m2.append(est.mu2)
    return MomentSample(prompt_ids, list(tokens), H, m2)


def aggregate_moments(H_per_prompt, m2_per_prompt) -> Moments:
    """Pool per-position H, m2 into μ, μ₂, E[H²], Var(Y) (the formulas of :func:`estimate_moments`
    on the stacked rows) plus prompt-level standard errors."""
    H = np.concatenate([np.asarray(h, dtype=np.float64) for h in H_per_prompt]) if H_per_prompt else np.zeros(0)
    m2 = np.concatenate([np.asarray(m, dtype=np.float64) for m in m2_per_prompt]) if m2_per_prompt else np.zeros(0)
    n = int(H.size)
    if n == 0:
        raise SpecboundError("no generated positions to estimate moments from")
    mu, mu2 = float(H.mean()), float(m2.mean())
    prompt_mu = [float(np.mean(h)) for h in H_per_prompt if len(h)]
    prompt_mu2 = [float(np.mean(m)) for m in m2_per_prompt if len(m)]
    return Moments(
        mu=mu, mu2=mu2, mean_H2=float((H * H).mean()), var_surprisal=mu2 - mu * mu, n=n,
        se_mu=float(H.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
        se_mu2=float(m2.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
        se_mu_prompt=mean_se(prompt_mu)[1], se_mu2_prompt=mean_se(prompt_mu2)[1], n_prompts=len(prompt_mu),
        std_H=float(H.std()), frac_H_below_0p1=float(np.mean(H < 0.1)))


def measure_moments(model, prompt_ids: list[list[int]], n_tokens: int, temperature: float, seed: int = 0,
                    progress=None, label: str = "moments", journal: PartialResults | None = None,
                    key: str = "moments") -> MomentsMeasurement:
    """μ, μ₂, E[H²] of ``model`` on its own samples at ``temperature`` (Pankratov & Alistarh 2026,
    §3.4); prompt i is sampled with seed ``seed + 1000·i``. Each prompt's sample is one journal unit
    ``{key}/{i}``."""
    journal = journal if journal is not None else no_journal()
    stage = Stage(progress, f"{label}: sampling", len(prompt_ids))
    stops = stop_token_ids(model)
    samples = []
    t0 = time.perf_counter()
    for i, ids in enumerate(prompt_ids):
        samples.append(journal.unit(f"{key}/{i}", MomentSample, lambda ids=ids, i=i: sample_with_moments(
            model, ids, n_tokens, temperature, make_generator(seed + 1000 * i), stops)))
        stage.advance()
    model.reset()
    est = aggregate_moments([s.H for s in samples], [s.m2 for s in samples])
    est.model, est.temperature, est.seconds = model.name, float(temperature), time.perf_counter() - t0
    est.tokens_per_prompt, est.prompts = int(n_tokens), len(prompt_ids)
    return MomentsMeasurement(est, samples)
