"""Surprisal moments μ, μ₂ of a model on its own samples (Pankratov & Alistarh 2026, §3.4; nats).

Continuations are sampled by the engine (plain decoding: :class:`~specbound.decoding.Speculator`
with no drafter) at the given temperature, no top-k/top-p, stopping after a stop token; then ONE
forward pass over the continuation (on the cached prompt) gives the model's law before every
generated token, whose H = −Σ p ln p and m2 = Σ p ln² p are computed by
:func:`specbound.theory.estimate_moments`. A prompt may be sampled several times (independent random
streams); the texts of one prompt form one cluster for standard errors (``MomentSample.prompt_index``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..decoding import STANDARD, PlainDrafter, SamplingConfig, Speculator, make_generator
from ..errors import SpecboundError
from ..models.tokens import stop_token_ids
from ..seeds import derive_seed
from ..theory.bounds import MomentEstimate, estimate_moments, pool_moments
from .journal import PartialResults, no_journal
from .records import Stage

__all__ = ["MomentSample", "MomentsMeasurement", "aggregate_moments", "measure_moments", "prompt_clusters",
           "sample_with_moments"]


@dataclass
class MomentSample:
    """One sampled continuation and H, m2 of the model's law before each of its tokens; ``prompt_index``:
    which prompt of the measurement it continues (−1 in records written before a prompt could be
    sampled more than once: then every sample is its own prompt)."""

    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    H: list[float] = field(default_factory=list)
    m2: list[float] = field(default_factory=list)
    prompt_index: int = -1


def prompt_clusters(samples) -> list[int]:
    """One cluster label per sample: its prompt (``prompt_index``), or the sample itself when unknown."""
    return [s.prompt_index if getattr(s, "prompt_index", -1) >= 0 else -(i + 1) for i, s in enumerate(samples)]


@dataclass
class MomentsMeasurement:
    """The estimate (THE moments record, :class:`~specbound.theory.bounds.MomentEstimate`, with
    standard errors per position and across prompts), the samples it was computed from, and how they
    were drawn."""

    estimate: MomentEstimate
    samples: list[MomentSample] = field(default_factory=list)
    model: str = ""
    temperature: float = 1.0
    tokens_per_prompt: int = 0
    seconds: float = 0.0


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
    # the laws before every sampled token: the last prompt token and the continuation read on the cached prompt
    model.crop(min(model.cache_length, len(prompt_ids) - 1))
    have = model.cache_length
    seq = prompt_ids[have:] + tokens[:-1]
    logits = model.forward(torch.tensor([seq], dtype=torch.long))[0, len(prompt_ids) - 1 - have:].double().numpy()
    model.reset()
    H, m2 = [], []
    for row in logits:
        est = estimate_moments(row[None], temperature=temperature, from_logits=True)
        H.append(est.mu)
        m2.append(est.mu2)
    return MomentSample(prompt_ids, list(tokens), H, m2)


def aggregate_moments(H_per_sample, m2_per_sample, clusters=None) -> MomentEstimate:
    """Pool per-position H, m2 of several samples into one estimate
    (:func:`~specbound.theory.bounds.pool_moments`: the formulas of :func:`estimate_moments` on the
    stacked rows, plus standard errors across ``clusters`` — one label per sample, its prompt; by
    default every sample is its own prompt)."""
    lengths = [len(h) for h in H_per_sample]
    if not sum(lengths):
        raise SpecboundError("no generated positions to estimate moments from")
    labels = np.arange(len(lengths)) if clusters is None else np.asarray(clusters)
    return pool_moments(np.concatenate([np.asarray(h, dtype=np.float64) for h in H_per_sample]),
                        np.concatenate([np.asarray(m, dtype=np.float64) for m in m2_per_sample]),
                        groups=np.repeat(labels, lengths))


def measure_moments(model, prompt_ids: list[list[int]], n_tokens: int, temperature: float, seed: int = 0,
                    progress=None, label: str = "moments", journal: PartialResults | None = None,
                    key: str = "moments", texts_per_prompt: int = 1) -> MomentsMeasurement:
    """μ, μ₂, E[H²] of ``model`` on its own samples at ``temperature`` (Pankratov & Alistarh 2026,
    §3.4), ``texts_per_prompt`` samples of every prompt (standard errors across prompts). Prompt i's
    first sample is one journal unit ``{key}/{i}`` and one random stream, named the same:
    ``derive_seed(seed, key, i)`` (:mod:`specbound.seeds`); its k-th further sample ``{key}/{i}/{k}``."""
    journal = journal if journal is not None else no_journal()
    texts = int(texts_per_prompt)
    if texts < 1:
        raise SpecboundError(f"texts_per_prompt must be >= 1, got {texts_per_prompt!r}")
    stage = Stage(progress, f"{label}: sampling", len(prompt_ids) * texts)
    stops = stop_token_ids(model)
    samples = []
    t0 = time.perf_counter()
    for i, ids in enumerate(prompt_ids):
        for k in range(texts):
            name = (key, i) if k == 0 else (key, i, k)
            sample = journal.unit("/".join(map(str, name)), MomentSample, lambda ids=ids, name=name: sample_with_moments(
                model, ids, n_tokens, temperature, make_generator(derive_seed(seed, *name)), stops))
            sample.prompt_index = i
            samples.append(sample)
            stage.advance()
    model.reset()
    return MomentsMeasurement(aggregate_moments([s.H for s in samples], [s.m2 for s in samples],
                                                prompt_clusters(samples)), samples,
                              model=model.name, temperature=float(temperature), tokens_per_prompt=int(n_tokens),
                              seconds=time.perf_counter() - t0)
