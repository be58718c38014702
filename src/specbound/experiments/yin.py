"""`specbound reproduce yin`, the toy chains: Yin et al. 2024 (NeurIPS), Fig. 2 and 3 in kind, and the settings.

* Fig. 2 — a random 7-state non-stationary chain, T = 50: (a) running Monte Carlo average of N_rej for
  SD (Alg. 1) against Thm 1; (b) batch SD with M = 4, 5 (design B) against Thm 3, with the exact
  values of design A (prefix-tree DFS: a derived variant, not the paper's statement); (c) E[N_rej]
  against M = 1..20 (designs A and B exact, Monte Carlo points, Prop. 1 limit of design B). The Monte
  Carlo is the vectorised NumPy simulator :func:`~specbound.theory.simulate_batch_rejections`; the
  decoding engine (:func:`~specbound.decoding.speculative_decode` on :class:`~specbound.models.ChainModel`
  s, drafting to the horizon) is run for fewer runs as a cross-check.
* Fig. 3 — batch improvement TV − ρ_M against M for Bernoulli and uniform pairs: closed forms
  against the recursive residual chain.

Fig. 4 (the over-acceptance Pareto front) is :mod:`.yin_pareto`, Table 1 (real models) :mod:`.yin_table1`;
:mod:`.yin_study` runs them all (``run(settings) -> YinResult``) and :mod:`.yin_report` renders the result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .report import Stage, omitted_if_none
from ..decoding import speculative_decode
from ..measure.llm import torch_threads
from ..measure.stats import mean_se, running_checkpoints, z_score
from ..models import ChainModel
from ..seeds import derive_seed
from ..theory import MarkovChain, expected_rejections, simulate_batch_rejections
from ..theory.rejections import (
    batch_expected_rejections, batch_rejections_limit, bernoulli_all_reject, bernoulli_batch_improvement,
    residual_chain, uniform_all_reject, uniform_batch_improvement,
)

__all__ = ["BERNOULLI_PAIRS", "PAPER", "Settings", "UNIFORM_PAIRS", "Fig2", "Fig3", "fig2_chain", "run_fig2",
           "run_fig3"]

DEFAULT_OUT = "runs/reproduce-yin"
#: Numbers reported by the paper (Fig. 2a): its chain is not published, so only behaviour is compared.
PAPER = {"fig2a_expected_rejections": 16.41, "fig2a_speedup": 3.05, "horizon": 50, "states": 7}
TABLE_EPS = (0.1, 0.2, 0.4, 0.8)
#: --quick must finish within 2 minutes; Table 1 gets what Fig. 2-4 leave of this.
QUICK_TOTAL_SECONDS = 105.0


@dataclass
class Settings:
    """Every size of the reproduction (written into results.json)."""

    quick: bool = False
    seed: int = 0
    out: str = DEFAULT_OUT
    # Fig. 2 chain (the construction of `specbound theory`, draft noise raised to 0.6)
    states: int = 7
    horizon: int = 50
    concentration: float = 0.5
    draft_noise: float = 0.6
    mc_runs: int = 20_000                       # NumPy runs for Fig. 2a/b
    curve_drafts: tuple[int, ...] = tuple(range(1, 21))
    curve_mc_drafts: tuple[int, ...] = (1, 2, 4, 8, 16)
    curve_mc_runs: int = 5_000
    engine_runs: int = 1000                     # decoding-engine runs per setting (SD, B4, B5)
    engine_runs_a: int = 500                    # ... for design A (M = 4, 5); 0 = skip
    # Fig. 3
    fig3_drafts: tuple[int, ...] = tuple(range(1, 21))
    # Fig. 4
    vocab: int = 10
    eps_points: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
    core_mc_rows: int = 200_000
    # Table 1: ≥ 60 paired (OPT, UNO) samples per ε row on ≥ 20 prompts in under an hour (a
    # size that decides the paper's claim); on the int8 target a (prompt, sample) unit of one form
    # (4 ε × OPT/UNO, 32 tokens each) takes ~25-35 s on 2 cores
    skip_llm: bool = False
    prompt_set: str = "mtbench"
    prompt_offset: int = 0                      # Table 1 uses prompts offset .. offset + prompts - 1 of the set
    prompts: int = 20
    samples: int = 3
    tokens: int = 32
    gamma: int = 5
    table_eps: tuple[float, ...] = TABLE_EPS
    forms: str = "auto"                         # auto (ratio if additive saturates, else additive) | additive | ratio | both
    calibration_prompts: int = 3
    target_precision: str = "int8"              # the target Table 1 runs (int8: the quantised target, 3-4x cheaper)
    llm_budget: float | None = 50 * 60.0        # seconds for the whole Table 1 (load + calibrate + generate + score)
    quick_total_seconds: float | None = None    # set: llm_budget = what Fig. 2-4 leave of these seconds (--quick)
    llm_load_budget: float | None = None        # seconds; skip the LLM table if loading takes longer
    threads: int | None = None                  # torch threads for the real models (None: torch's default, every
                                                # core; give 1 when another busy process shares the CPU)
    bootstrap: int = 4000                       # prompt-clustered bootstrap resamples of each row's win rate

    @classmethod
    def make(cls, quick: bool = False, **overrides) -> "Settings":
        """Default sizes, or the --quick ones, then ``overrides`` (None values are ignored)."""
        s = cls(quick=quick)
        if quick:
            s.mc_runs, s.curve_mc_runs = 2_000, 1_000
            s.curve_mc_drafts = (1, 2, 4, 8)
            s.engine_runs, s.engine_runs_a = 30, 0
            s.core_mc_rows = 20_000
            s.prompts, s.samples, s.tokens = 2, 1, 16
            s.table_eps = (0.1, 0.8)
            s.calibration_prompts = 1
            s.llm_load_budget = 60.0
            s.llm_budget = s.quick_total_seconds = QUICK_TOTAL_SECONDS    # minus the time Fig. 2-4 take
        for name, value in overrides.items():
            if value is not None:
                setattr(s, name, value)
        if overrides.get("llm_budget") is not None:
            s.quick_total_seconds = None              # a budget given is kept as given
        return s


# =============================================================================================== Fig. 2
@dataclass
class ChainSpec:
    states: int
    horizon: int
    concentration: float
    draft_noise: float
    target_seed: int
    draft_seed: int
    construction: str = ("target = MarkovChain.random(states, horizon, concentration, seed); "
                         "draft = target.perturbed(draft_noise, seed + 1)")


@dataclass
class MonteCarlo:
    mean: float
    se: float
    runs: int
    z: float | None = omitted_if_none()


@dataclass
class Running:
    runs: list[int]
    running_mean: list[float]


@dataclass
class Fig2Row:
    drafts: int
    design: str
    exact: float
    speedup: float
    numpy_mc: MonteCarlo
    numpy_z: float
    running: Running
    formula: str
    engine: MonteCarlo | None = omitted_if_none()


@dataclass
class CurvePoint:
    drafts: int
    design: str
    mean: float
    se: float
    runs: int
    exact: float
    z: float


@dataclass
class Fig2Curve:
    drafts: list[int]
    exact_B: list[float]
    exact_A: list[float]
    limit_B: float
    limit_speedup: float
    mc_points: list[CurvePoint]
    nonincreasing_B: bool
    nonincreasing_A: bool
    A_le_B: bool


@dataclass
class Fig2:
    chain: ChainSpec
    rows: dict[str, Fig2Row]
    curve: Fig2Curve
    paper: dict[str, float] = field(default_factory=lambda: dict(PAPER))


def fig2_chain(seed: int = 0, states: int = 7, horizon: int = 50, concentration: float = 0.5,
               draft_noise: float = 0.6):
    """The Fig. 2 instance: target = random non-stationary chain (Dirichlet rows), draft = target rows
    mixed with random rows (weight ``draft_noise``). Returns (target, draft). The pair is named by
    ``seed`` alone — target ``seed``, draft ``seed + 1``, as ``specbound theory`` builds it: a problem
    instance, not a random stream (:mod:`specbound.seeds`), kept as the published numbers have it."""
    target = MarkovChain.random(states, horizon=horizon, concentration=concentration, seed=seed)
    return target, target.perturbed(draft_noise, seed=seed + 1)


def engine_rejections(target, draft, horizon: int, drafts: int, design: str, runs: int, seed: int,
                      stage: Stage | None = None) -> np.ndarray:
    """N_rej of the decoding engine on ChainModels (drafting to the horizon), ``runs`` times
    (``DecodeMetrics.rejections``: rounds that ended at a rejected drafted token). Run i starts from
    its own initial state and decodes with its own stream (:mod:`specbound.seeds`)."""
    target_model, draft_model = ChainModel(target, "target-chain"), ChainModel(draft, "draft-chain")
    rng = np.random.default_rng(derive_seed(seed, "yin fig2 engine starts", drafts, design))
    initial = rng.choice(target.n_states, size=runs, p=target.initial)
    out = np.empty(runs, dtype=np.int64)
    with torch_threads(1):     # tiny tensors: OpenMP spinning makes 2 threads 5-50x slower on a busy box
        for i in range(runs):
            res = speculative_decode(target_model, draft_model, [int(initial[i])], horizon, gamma=None,
                                     drafts=None if drafts == 1 else drafts, design=design,
                                     seed=derive_seed(seed, "yin fig2 engine", drafts, design, i))
            out[i] = res.metrics.rejections
            if stage is not None:
                stage.advance()
    return out


def _formula(drafts: int, design: str) -> str:
    if drafts == 1:
        return "Thm 1"
    return "Thm 3 (design B recursion)" if design == "B" else "design A recursion (derived variant, not Thm 3)"


def run_fig2(s: Settings, progress=None) -> tuple[Fig2, dict[str, np.ndarray]]:
    """Fig. 2 numbers and the raw NumPy Monte Carlo samples of the rows (for the running-average plots)."""
    target, draft = fig2_chain(s.seed, s.states, s.horizon, s.concentration, s.draft_noise)
    T = s.horizon
    pair = dict(target=target, draft=draft, horizon=T)
    exact_sd = expected_rejections(**pair)

    def exact(m: int, design: str) -> float:
        return exact_sd if m == 1 else batch_expected_rejections(**pair, drafts=m, design=design)

    def mc(drafts: int, design: str, runs: int, stream: str):
        samples = simulate_batch_rejections(**pair, drafts=drafts, design=design, n_runs=runs,
                                            seed=np.random.default_rng(derive_seed(s.seed, stream, drafts, design)))
        mean, se = mean_se(samples)
        return samples, MonteCarlo(mean=mean, se=se, runs=runs)

    settings = [(1, "B"), (4, "B"), (5, "B"), (4, "A"), (5, "A")]
    stage = Stage(progress, "Fig. 2 NumPy Monte Carlo", len(settings) + 2 * len(s.curve_mc_drafts))
    rows, raw = {}, {}
    for drafts, design in settings:
        value = exact(drafts, design)
        samples, stats = mc(drafts, design, s.mc_runs, "yin fig2 rows")
        key = "sd" if drafts == 1 else f"M{drafts}{design}"
        raw[key] = samples
        runs, running_mean = running_checkpoints(samples)
        rows[key] = Fig2Row(drafts=drafts, design=design if drafts > 1 else "-", exact=value, speedup=T / value,
                            numpy_mc=stats, numpy_z=z_score(stats.mean, value, stats.se),
                            running=Running(runs=runs, running_mean=running_mean), formula=_formula(drafts, design))
        stage.advance()
    curve_b = [exact(m, "B") for m in s.curve_drafts]
    curve_a = [exact(m, "A") for m in s.curve_drafts]
    limit = batch_rejections_limit(**pair)
    points = []
    for design in ("B", "A"):
        for m in s.curve_mc_drafts:
            if not (design == "A" and m == 1):
                _, stats = mc(m, design, s.curve_mc_runs, "yin fig2 curve")
                value = (curve_b if design == "B" else curve_a)[s.curve_drafts.index(m)]
                points.append(CurvePoint(drafts=m, design=design, mean=stats.mean, se=stats.se, runs=stats.runs,
                                         exact=value, z=z_score(stats.mean, value, stats.se)))
            stage.advance()
    engine_plan = [(1, "B", s.engine_runs), (4, "B", s.engine_runs), (5, "B", s.engine_runs)]
    if s.engine_runs_a:
        engine_plan += [(4, "A", s.engine_runs_a), (5, "A", s.engine_runs_a)]
    engine_plan = [p for p in engine_plan if p[2] > 0]
    if engine_plan:
        estage = Stage(progress, "Fig. 2 decoding engine (ChainModel)", sum(p[2] for p in engine_plan))
        for drafts, design, runs in engine_plan:
            samples = engine_rejections(target, draft, T, drafts, design, runs, s.seed, estage)
            mean, se = mean_se(samples)
            row = rows["sd" if drafts == 1 else f"M{drafts}{design}"]
            z = z_score(mean, row.exact, se)
            row.engine = MonteCarlo(mean=mean, se=se, runs=runs, z=z if math.isfinite(z) else None)
    curve = Fig2Curve(drafts=list(s.curve_drafts), exact_B=curve_b, exact_A=curve_a, limit_B=limit,
                      limit_speedup=T / limit, mc_points=points,
                      nonincreasing_B=bool(np.all(np.diff(curve_b) <= 1e-12)),
                      nonincreasing_A=bool(np.all(np.diff(curve_a) <= 1e-12)),
                      A_le_B=bool(np.all(np.asarray(curve_a) <= np.asarray(curve_b) + 1e-12)))
    chain = ChainSpec(states=s.states, horizon=T, concentration=s.concentration, draft_noise=s.draft_noise,
                      target_seed=s.seed, draft_seed=s.seed + 1)
    return Fig2(chain=chain, rows=rows, curve=curve), raw


# =============================================================================================== Fig. 3
BERNOULLI_PAIRS = ((0.2, 0.6), (0.5, 0.9), (0.7, 0.2), (0.1, 0.3))     # (draft P(1) = a, target P(1) = c)
UNIFORM_PAIRS = ((10, 1), (10, 3), (10, 6), (4, 1))                  # (draft support k, target support m)


@dataclass
class Fig3Pair:
    label: str
    tv: float
    closed: list[float]
    recursive: list[float]
    max_abs_diff: float
    max_abs_diff_rho: float
    draft_p1: float | None = omitted_if_none()
    target_p1: float | None = omitted_if_none()
    k: int | None = omitted_if_none()
    m: int | None = omitted_if_none()


@dataclass
class Fig3:
    drafts: list[int]
    bernoulli: list[Fig3Pair]
    uniform: list[Fig3Pair]
    max_abs_diff: float


def run_fig3(s: Settings) -> Fig3:
    """Batch improvement TV − ρ_M of one round start: closed forms vs the recursive residual chain."""
    drafts = np.asarray(s.fig3_drafts)
    mmax = int(drafts.max())

    def pair(label, tv, target_law, draft_law, closed, rho_closed, **extra) -> Fig3Pair:
        _, rho = residual_chain(target=target_law, draft=draft_law, drafts=mmax)
        recursive = rho[1] - rho[drafts]
        return Fig3Pair(label=label, tv=tv, closed=np.asarray(closed).tolist(), recursive=recursive.tolist(),
                        max_abs_diff=float(np.max(np.abs(closed - recursive))),
                        max_abs_diff_rho=float(np.max(np.abs(rho_closed - rho[drafts]))), **extra)

    bern = [pair(f"a={a:g}, c={c:g}", abs(c - a), np.array([1 - c, c]), np.array([1 - a, a]),
                 bernoulli_batch_improvement(target_p1=c, draft_p1=a, drafts=drafts),
                 bernoulli_all_reject(target_p1=c, draft_p1=a, drafts=drafts), draft_p1=a, target_p1=c)
            for a, c in BERNOULLI_PAIRS]
    unif = []
    for k, m in UNIFORM_PAIRS:
        target_law = np.zeros(k)
        target_law[:m] = 1.0 / m
        unif.append(pair(f"k={k}, m={m}", 1 - m / k, target_law, np.full(k, 1.0 / k),
                         uniform_batch_improvement(target_support=m, draft_support=k, drafts=drafts),
                         uniform_all_reject(target_support=m, draft_support=k, drafts=drafts), k=k, m=m))
    return Fig3(drafts=drafts.tolist(), bernoulli=bern, uniform=unif,
                max_abs_diff=max(r.max_abs_diff for r in bern + unif))
