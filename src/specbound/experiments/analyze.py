"""`specbound analyze`, the measurement: Pankratov & Alistarh's speed-of-light quantities for one prompt set.

(a) **moments** μ, μ₂, E[H²] of the target on its own samples (:mod:`.moments`);
(b) the **oracle**: exact E[X | T*(P)] at positions of those samples and empirical oracle tree SD
    (:mod:`.oracle`);
(c) the **bound** curves of every form at the measured μ, μ₂ (:func:`specbound.theory.bound_all_forms`);
(d) the **real drafters**: exact E[X | drafted tree] at the oracle's positions and τ(P) of tree SD
    with the chain and dynamic drafters (:mod:`.drafter_values`);
(e) **speed-ups**: constant-time model (= τ; E[X] + 1 for the oracle and the bounds) and a
    wall-clock estimate τ·t(1)/(draft seconds per round + t(P + 1)) with the measured t(k).

X counts accepted draft tokens (the bonus/recovered token is not), τ = tokens per target call. Results
are typed and keyed by the capacity P (an int); :mod:`.analyze_report` renders them. :func:`run` is the
study (loads the pair and the prompts, checks them, runs :func:`analyze_set`, which works on loaded models).
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
from ..assets.prompts import load_prompts
from ..errors import SpecboundError
from ..theory.bounds import BOUND_FORMS, MomentEstimate, bound_all_forms, bound_is_valid
from ..theory.speedup import CostProfile
from ..measure.drafter_values import DrafterRuns, DrafterValues, drafter_runs, drafter_values, measure_target_costs
from ..measure.journal import PartialResults, no_journal
from ..measure.llm import encode_prompts
from ..measure.moments import MomentSample, measure_moments
from ..measure.oracle import OracleSD, OracleValues, oracle_sd, oracle_values
from ..models import loading as model_loading   # a module: tests and commands swap its loaders
from .report import omitted_if_none, progress_bar

__all__ = ["AnalyzeConfig", "Costs", "SetAnalysis", "Settings", "SpeedupRow", "Speedups", "TightestBound",
           "analyze_set", "run", "speedups", "tightest_bound"]

DEFAULT_CAPACITIES = (1, 2, 4, 8, 16, 32, 64)
TREE_DRAFTER_KINDS = ("chain", "dynamic", "sampled")


@dataclass
class AnalyzeConfig:
    """How much to measure per prompt set (numbers are written into every report)."""

    n_prompts: int = 6                    # (a) prompts sampled for the moments
    tokens: int = 48                      # (a) tokens sampled per prompt (stops early at a stop token)
    texts_per_prompt: int = 1             # (a) independent samples of every prompt (one cluster for SEs)
    capacities: tuple[int, ...] = DEFAULT_CAPACITIES
    temperature: float = 1.0
    oracle_positions: int = 10            # (b) positions (contexts) at which T*(P_max) is built
    drafter_positions: int | None = None  # (d) exact drafter values at this many of the oracle positions (evenly
                                          #     spaced among them); None = at every oracle position
    oracle_width: int = 12                # (b) target nodes read per oracle read (prefetch)
    oracle_sd_capacities: tuple[int, ...] | None = (1, 4, 16, 64)   # (b) empirical oracle SD; None = all
    oracle_sd_prompts: int = 1
    oracle_sd_tokens: int = 40
    drafters: tuple[str, ...] = ("chain", "dynamic")
    drafter_prompts: int = 2              # (d) prompts per P and drafter
    drafter_tokens: int = 40              # (d) tokens per prompt
    cost_repeats: int = 3                 # (e) repeats of each t(k) measurement (median)
    seed: int = 0

    def __post_init__(self):
        try:
            caps = tuple(int(c) for c in self.capacities)
        except (TypeError, ValueError):
            raise SpecboundError(f"capacities must be integers >= 1, got {self.capacities!r}") from None
        if not caps or any(c < 1 for c in caps):
            raise SpecboundError(f"capacities must be integers >= 1, got {self.capacities!r}")
        self.capacities = tuple(sorted(set(caps)))
        if self.oracle_sd_capacities is not None:
            self.oracle_sd_capacities = tuple(sorted({int(c) for c in self.oracle_sd_capacities} & set(caps)))
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature > 0):
            raise SpecboundError(f"temperature must be > 0 (at T = 0 the entropy is 0 and the bounds are void), "
                                 f"got {self.temperature!r}")
        for name in ("n_prompts", "tokens", "texts_per_prompt", "oracle_width", "cost_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecboundError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("oracle_positions", "oracle_sd_prompts", "oracle_sd_tokens", "drafter_prompts",
                     "drafter_tokens", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecboundError(f"{name} must be an integer >= 0, got {value!r}")
        if self.drafter_positions is not None and (isinstance(self.drafter_positions, bool)
                                                   or not isinstance(self.drafter_positions, int)
                                                   or self.drafter_positions < 0):
            raise SpecboundError(f"drafter_positions must be None or an integer >= 0, got {self.drafter_positions!r}")
        self.drafters = tuple(self.drafters)
        unknown = set(self.drafters) - set(TREE_DRAFTER_KINDS)
        if unknown:
            raise SpecboundError(f"unknown drafters {sorted(unknown)}: use {', '.join(TREE_DRAFTER_KINDS)}")

    @classmethod
    def quick(cls, **overrides) -> "AnalyzeConfig":
        """A small configuration for smoke tests (about a minute per set on the default pair)."""
        base = dict(n_prompts=2, tokens=12, capacities=(1, 4, 16), oracle_positions=3,
                    oracle_sd_capacities=(1, 4), oracle_sd_tokens=10, drafter_prompts=1,
                    drafter_tokens=12, cost_repeats=2)
        base.update(overrides)
        return cls(**base)

    @property
    def sd_capacities(self) -> tuple[int, ...]:
        return self.capacities if self.oracle_sd_capacities is None else self.oracle_sd_capacities


@dataclass
class Costs:
    ks: list[int]
    seconds: list[float]

    def profile(self) -> CostProfile:
        return CostProfile(tuple(self.ks), tuple(self.seconds))


@dataclass
class SpeedupRow:
    """Speed-ups at one P: ``const[name]`` under the constant-time model, ``wall[name]`` wall-clock
    estimates; names are bound forms, "oracle", "oracle_sd", drafter kinds and "<kind>_exact"."""

    P: int
    t_P_plus_1: float
    t_1: float
    const: dict[str, float] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)


@dataclass
class Speedups:
    rows: list[SpeedupRow]
    t_1: float


@dataclass
class TightestBound:
    tightest: str
    value: float
    oracle: float = float("nan")
    gap: float = float("nan")
    holds: bool | None = None
    asymptotic_minus_oracle: float = float("nan")
    violated: list[str] = field(default_factory=list)


@dataclass
class SetAnalysis:
    """Everything measured on one prompt set (JSON: ``analyze.json``)."""

    set: str
    target: str
    draft: str | None
    config: AnalyzeConfig
    moments: MomentEstimate
    samples: list[MomentSample]
    bounds: dict[str, list]                       # bound_all_forms: capacity, each form, published_is_bound
    draft_backend: str | None = None
    target_backend: str | None = None
    prompt_ids_lengths: list[int] = field(default_factory=list)
    prompt_names: list[str] | None = None
    torch_threads: int = 1
    timings: dict[str, float] = field(default_factory=dict)
    oracle: OracleValues | None = omitted_if_none()
    drafter_exact: DrafterValues | None = omitted_if_none()
    oracle_sd: OracleSD | None = omitted_if_none()
    drafters: dict[str, DrafterRuns] = field(default_factory=dict)
    costs: Costs | None = omitted_if_none()
    speedups: Speedups | None = omitted_if_none()               # derived: finalize()
    tightest_bound: dict[int, TightestBound] = field(default_factory=dict)   # derived: finalize()

    def finalize(self) -> "SetAnalysis":
        """(Re)compute the derived parts (speed-ups, tightest bound) from the measured ones."""
        self.speedups = speedups(self)
        self.tightest_bound = tightest_bound(self)
        return self


def speedups(result: SetAnalysis) -> Speedups:
    """(e) per P: constant-time speed-ups (= τ; E[X] + 1 for the oracle and the bounds) and wall-clock
    estimates τ·t(1)/(draft s per round + t(P+1)); oracle and bounds with free drafting."""
    caps = list(result.config.capacities)
    prof = result.costs.profile() if result.costs else None
    t1 = float(prof(1)) if prof else float("nan")
    rows = []
    for i, P in enumerate(caps):
        tP = float(prof(P + 1)) if prof else float("nan")
        row = SpeedupRow(P, tP, t1)
        for form in BOUND_FORMS:
            row.const[form] = float(result.bounds[form][i]) + 1.0
        row.wall["renewal_free_drafting"] = row.const["renewal"] * t1 / tP
        if result.oracle:
            row.const["oracle"] = float(result.oracle.mean[i]) + 1.0
            row.wall["oracle_free_drafting"] = row.const["oracle"] * t1 / tP
        for kind, runs in result.drafters.items():
            r = runs.by_capacity.get(P)
            if r is None:
                continue
            row.const[kind] = r.tau
            row.wall[kind] = r.tau * t1 / (r.draft_seconds_per_round + tP)
            exact = result.drafter_exact.of(kind) if result.drafter_exact else None
            if exact is not None and exact.mean:
                row.const[f"{kind}_exact"] = float(exact.mean[i]) + 1.0
                row.wall[f"{kind}_exact"] = row.const[f"{kind}_exact"] * t1 / (r.draft_seconds_per_round + tP)
        block = result.drafter_exact.chain_block if result.drafter_exact else None
        chain_run = result.drafters["chain"].by_capacity.get(P) if "chain" in result.drafters else None
        if block is not None and block.mean and chain_run is not None:    # the chain's drafts, block-verified
            row.const["chain_block_exact"] = float(block.mean[i]) + 1.0
            row.wall["chain_block_exact"] = row.const["chain_block_exact"] * t1 / (chain_run.draft_seconds_per_round + tP)
        sd = result.oracle_sd.by_capacity.get(P) if result.oracle_sd else None
        if sd is not None:
            row.const["oracle_sd"] = sd.tau
        rows.append(row)
    return Speedups(rows, t1)


def tightest_bound(result: SetAnalysis) -> dict[int, TightestBound]:
    """Per P: the smallest rigorous form (published only for P ≥ 3; asymptotic is never a bound),
    whether it stays above the measured oracle, and how far the asymptotic form is from it."""
    out = {}
    for i, P in enumerate(result.config.capacities):
        forms = {f: result.bounds[f][i] for f in BOUND_FORMS if bound_is_valid(f, P)}
        best = min(forms, key=forms.get)
        entry = TightestBound(best, forms[best])
        if result.oracle:
            o = result.oracle.mean[i]
            entry.oracle, entry.gap, entry.holds = o, forms[best] - o, bool(forms[best] >= o)
            entry.asymptotic_minus_oracle = result.bounds["asymptotic"][i] - o
            entry.violated = [f for f, v in forms.items() if v < o]
        out[P] = entry
    return out


def drafter_position_indices(n_oracle: int, wanted: int | None) -> list[int]:
    """Which of the ``n_oracle`` oracle positions get exact drafter values: all of them, or ``wanted``
    spread evenly over them (the drafters' values are then compared with the oracle on these rows)."""
    if wanted is None or wanted >= n_oracle:
        return list(range(n_oracle))
    return np.unique(np.round(np.linspace(0, n_oracle - 1, wanted)).astype(int)).tolist()


def analyze_set(target, draft, set_name: str, cfg: AnalyzeConfig, prompts=None, prompt_ids=None,
                progress: bool = True, log=print, journal: PartialResults | None = None) -> SetAnalysis:
    """Run (a)–(e) for one prompt set on a loaded target (and draft; None skips (d)). ``prompt_ids``
    (lists of token ids) may replace ``prompts`` (for tokenizer-less test models). Every unit of work
    goes through ``journal`` (``--resume``), keyed by the set name."""
    journal = journal if journal is not None else no_journal()
    if prompt_ids is None:
        if prompts is None:
            prompts = load_prompts(set_name, cfg.n_prompts)
        prompt_ids = encode_prompts(target, prompts)
    prompt_ids = [list(map(int, p)) for p in prompt_ids]
    if not prompt_ids:
        raise SpecboundError(f"prompt set {set_name!r} gave no prompts")
    timings: dict[str, float] = {}
    T, caps, key = cfg.temperature, cfg.capacities, f"{set_name}/"
    bar = progress_bar(progress)
    with bar if progress else nullcontext():
        pb = bar if progress else None
        t0 = time.perf_counter()
        mom = measure_moments(target, prompt_ids[:cfg.n_prompts], cfg.tokens, T, cfg.seed, pb,
                              label=f"{set_name} (a) target moments", journal=journal, key=key + "moments",
                              texts_per_prompt=cfg.texts_per_prompt)
        timings["moments"] = time.perf_counter() - t0
        est = mom.estimate
        log(f"[{set_name}] mu={est.mu:.4f}±{est.se_mu:.4f}  mu2={est.mu2:.4f}±{est.se_mu2:.4f}  "
            f"E[H^2]={est.mean_H2:.4f}  n={est.n}  ({timings['moments']:.0f}s)")
        result = SetAnalysis(
            set=set_name, target=target.name, draft=getattr(draft, "name", None), config=cfg, moments=est,
            samples=mom.samples, bounds={k: np.asarray(v).tolist()
                                         for k, v in bound_all_forms(est.mu, est.mu2, list(caps)).items()},
            draft_backend=draft.info.kernels if draft is not None else None, target_backend=target.info.kernels,
            prompt_ids_lengths=[len(p) for p in prompt_ids], prompt_names=[p.id for p in prompts] if prompts else None,
            torch_threads=torch.get_num_threads(), timings=timings)
        if cfg.oracle_positions > 0:
            t0 = time.perf_counter()
            result.oracle = oracle_values(target, mom.samples, caps, cfg.oracle_positions, T, cfg.oracle_width, pb,
                                          journal, key + "oracle")
            timings["oracle_exact"] = time.perf_counter() - t0
            log(f"[{set_name}] oracle E[X*]: " + ", ".join(f"P={c}: {m:.3f}" for c, m in zip(caps, result.oracle.mean))
                + f"  ({result.oracle.reads_total} target reads, {timings['oracle_exact']:.0f}s)")
            if draft is not None and cfg.drafter_positions != 0:
                t0 = time.perf_counter()
                positions = [(p.sample, p.position) for p in result.oracle.positions]
                keep = drafter_position_indices(len(positions), cfg.drafter_positions)
                result.drafter_exact = drafter_values(target, draft, mom.samples, [positions[k] for k in keep], caps,
                                                      T, cfg.seed, pb, journal, key + "drafter_exact")
                result.drafter_exact.oracle_indices = keep
                timings["drafter_exact"] = time.perf_counter() - t0
                log(f"[{set_name}] exact E[X|T] at {len(keep)} of the oracle positions: " + "; ".join(
                    f"{kind}: " + ", ".join(f"P={c}: {m:.2f}" for c, m in zip(caps, result.drafter_exact.of(kind).mean))
                    for kind in ("dynamic", "chain", "chain_block") if result.drafter_exact.of(kind) is not None)
                    + f"  ({timings['drafter_exact']:.0f}s)")
        if cfg.oracle_sd_prompts > 0 and cfg.oracle_sd_tokens > 0 and cfg.sd_capacities:
            t0 = time.perf_counter()
            result.oracle_sd = oracle_sd(target, prompt_ids, cfg.sd_capacities, cfg.oracle_sd_prompts,
                                         cfg.oracle_sd_tokens, T, cfg.oracle_width, cfg.seed, pb, journal,
                                         key + "oracle_sd")
            timings["oracle_sd"] = time.perf_counter() - t0
            log(f"[{set_name}] oracle SD mean X / mean E[X|T]: " + ", ".join(
                f"P={c}: {r.mean_X:.2f}/{r.mean_value:.2f}" for c, r in result.oracle_sd.by_capacity.items())
                + f"  ({timings['oracle_sd']:.0f}s)")
        if draft is not None and cfg.drafter_prompts > 0 and cfg.drafter_tokens > 0:
            for kind in cfg.drafters:
                t0 = time.perf_counter()
                result.drafters[kind] = drafter_runs(target, draft, prompt_ids, caps, kind, cfg.drafter_prompts,
                                                     cfg.drafter_tokens, T, cfg.seed, pb, journal, key + "drafter")
                timings[f"drafter_{kind}"] = time.perf_counter() - t0
                log(f"[{set_name}] {kind} tau: " + ", ".join(
                    f"P={c}: {r.tau:.2f}" for c, r in result.drafters[kind].by_capacity.items())
                    + f"  ({timings[f'drafter_{kind}']:.0f}s)")
        t0 = time.perf_counter()
        costs = measure_target_costs(target, prompt_ids[0], caps, cfg.cost_repeats)
        result.costs = Costs(list(costs.ks), list(costs.seconds))
        timings["costs"] = time.perf_counter() - t0
    return result.finalize()


@dataclass
class Settings:
    """What ``specbound analyze`` measures: one prompt set on one pair (packaged names or directories),
    with the sizes of ``config``."""

    prompt_set: str
    config: AnalyzeConfig = field(default_factory=AnalyzeConfig)
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    draft_int8: bool = True


def run(settings: Settings, progress: bool = True, journal: PartialResults | None = None,
        log=print) -> SetAnalysis:
    """The study: load the prompts and the pair (the int8 draft unless ``draft_int8`` is False), check
    that they share a vocabulary, then :func:`analyze_set` (every unit through ``journal``)."""
    cfg = settings.config
    prompts = load_prompts(settings.prompt_set, cfg.n_prompts)
    target = model_loading.load_model(settings.target, progress=progress)
    draft = model_loading.load_model(settings.draft, progress=progress, int8=settings.draft_int8)
    if target.vocab_size != draft.vocab_size:
        raise SpecboundError(f"vocabulary mismatch: {target.name} {target.vocab_size} vs {draft.name} "
                             f"{draft.vocab_size}")
    if journal is not None and (journal.reused or len(journal)):
        log(f"resuming: {len(journal)} finished units in {journal.path}")
    return analyze_set(target, draft, settings.prompt_set, cfg, prompts=prompts, progress=progress, log=log,
                       journal=journal)
