"""`specbound reproduce pankratov`, the measurement: Pankratov & Alistarh 2026 in kind (nats throughout).

(i)   **Table** in kind: μ, μ₂ = E[Σ p ln² p] and E[H²] per model × prompt set, each model on its own
      samples at temperature 1 (§3.4): the packaged Qwen2.5-Coder 1.5B (target) and 0.5B (draft), and
      SmolLM2-135M when it is converted.
(ii)  **Fig. 2** in kind: speed-up vs capacity P for the bound, the oracle T*(P) and the real
      drafters, per prompt set — :func:`.analyze.analyze_set`.
(iii) **Synthetic i.i.d. checks** (docs/paper-notes.md, Pankratov §5 T3/T4): the slope of E[X*] vs
      ln P must be 1/μ (within 5%), and the rigorous bounds must hold, for identical and random i.i.d.
      environments.

:func:`run` is the study (:class:`Settings` in, :class:`PankratovResult` out: (iii), then (i) and (ii)
when the packaged pair is there); :mod:`.pankratov_report` renders it.
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..assets import models as asset_models   # a module: tests swap what it finds installed
from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
from ..assets.prompts import load_prompts
from ..errors import SpecboundError
from ..measure.drafter_values import drafter_values
from ..measure.llm import default_pair_status
from ..models import loading as model_loading   # a module: tests and commands swap its loaders
from ..theory.bounds import MomentEstimate, entropy_moments, speed_of_light
from ..theory.trees import optimal_tree
from .analyze import AnalyzeConfig, SetAnalysis, analyze_set
from ..measure.journal import PartialResults, no_journal
from ..measure.llm import encode_prompts
from ..measure.moments import measure_moments
from .report import omitted_if_none, progress_bar
from ..measure.stats import Z95, fit_log_slope, variance_split
from ..seeds import derive_seed

__all__ = ["IDENTICAL_CASES", "BoundClaim", "Claims", "Interval", "LLMStudy", "MomentRow", "OraclePrecision",
           "OrderClaim", "PankratovResult", "SETS", "Settings", "SlopeClaim", "SyntheticCase", "SyntheticChecks",
           "augment", "claims", "identical_environment_case", "llm_configs", "moments_table",
           "random_environment_case", "run", "run_llm", "synthetic_checks"]

PAPER = "Pankratov & Alistarh 2026 (arXiv 2512.11718)"
SETS = ("humaneval", "mtbench", "gsm8k")
SLOPE_TOLERANCE = 0.05

#: (name, law) of the identical deterministic environments (docs/paper-notes.md, Pankratov §5 T3)
IDENTICAL_CASES = (
    ("T3a p=(.6,.25,.1,.05)", (0.6, 0.25, 0.1, 0.05)),
    ("T3b p=(.5,.3,.2)", (0.5, 0.3, 0.2)),
    ("T3c peaked p=(.9,.05,.03,.02)", (0.9, 0.05, 0.03, 0.02)),
    ("T3d uniform V=4", (0.25, 0.25, 0.25, 0.25)),
)


# ---------------------------------------------------------------------------------------------------
# (iii) synthetic i.i.d. checks
# ---------------------------------------------------------------------------------------------------
@dataclass
class SyntheticCase:
    """One environment: E[X*] on a geometric grid of P, its fitted slope against ln P vs 1/μ, bounds."""

    name: str
    kind: str
    mu: float
    mu2: float
    P: list[int]
    value: list[float]
    asymptotic: list[float]
    renewal: list[float]
    slope: float
    slope_se: float | None
    inverse_mu: float
    relative_error: float
    within_tolerance: bool
    renewal_holds: bool
    published_holds_P_ge_3: bool
    p_range: list[int]
    checkpoints: dict[int, float]
    seconds: float = 0.0
    law: list[float] | None = omitted_if_none()
    mean_H2: float | None = omitted_if_none()
    value_se: list[float] | None = omitted_if_none()
    n_envs: int | None = omitted_if_none()
    moment_draws: int | None = omitted_if_none()


@dataclass
class SyntheticChecks:
    cases: list[SyntheticCase]
    tolerance: float
    all_within_tolerance: bool
    all_bounds_hold: bool


def _grid(p_min: int, p_max: int, n: int = 60) -> np.ndarray:
    return np.unique(np.round(np.geomspace(p_min, p_max, n)).astype(int))


def _checks(run: np.ndarray, mu: float, mu2: float, p_max: int) -> tuple[bool, bool]:
    all_P = np.arange(1, p_max + 1)
    renewal_all = speed_of_light(mu, mu2, all_P, "renewal")
    published = speed_of_light(mu, mu2, all_P[2:], "published")
    return bool(np.all(run <= renewal_all + 1e-9)), bool(np.all(run[2:] <= published + 1e-9))


def identical_environment_case(name: str, law, p_max: int, p_min: int = 64) -> SyntheticCase:
    """Same law at every node (docs/paper-notes.md, Pankratov §5 T3): E[X|T*(P)] for all P ≤ p_max
    from ONE best-first search (nested optimal trees: running sums of path probabilities), slope of
    E* vs ln P over [p_min, p_max] against 1/μ, and the bounds (renewal for all P, published for P ≥ 3)."""
    law = np.asarray(law, dtype=np.float64)
    t0 = time.perf_counter()
    tree = optimal_tree(lambda path: law, p_max)
    run = np.cumsum(np.asarray(tree.path_probs, dtype=np.float64))
    H, m2 = entropy_moments(law)
    mu, mu2 = float(H), float(m2)
    P = _grid(p_min, p_max)
    values = run[P - 1]
    slope = fit_log_slope(P, values)
    renewal_holds, published_holds = _checks(run, mu, mu2, p_max)
    return SyntheticCase(
        name=name, kind="identical", law=law.tolist(), mu=mu, mu2=mu2, P=P.tolist(), value=values.tolist(),
        asymptotic=speed_of_light(mu, mu2, P, "asymptotic").tolist(), renewal=speed_of_light(mu, mu2, P, "renewal").tolist(),
        slope=slope, slope_se=None, inverse_mu=1.0 / mu, relative_error=slope * mu - 1.0,
        within_tolerance=bool(abs(slope * mu - 1.0) <= SLOPE_TOLERANCE), renewal_holds=renewal_holds,
        published_holds_P_ge_3=published_holds, p_range=[int(p_min), int(p_max)], seconds=time.perf_counter() - t0,
        checkpoints={c: float(run[c - 1]) for c in (16, 20, 64, 84, 256, 1024, 4096, 16384) if c <= p_max})


def _random_law(rng: np.random.Generator, vocab: int, betas) -> np.ndarray:
    beta = betas[rng.integers(len(betas))]
    z = beta * rng.standard_normal(vocab)
    e = np.exp(z - z.max())
    return e / e.sum()


def random_environment_case(n_envs: int, p_max: int, p_min: int = 64, vocab: int = 16, betas=(0.5, 2.0, 6.0),
                            moment_draws: int = 100_000, seed: int = 0) -> SyntheticCase:
    """i.i.d. random environment (docs/paper-notes.md, Pankratov §5 T4): every node gets a fresh
    softmax(β·g), g ~ N(0, I_V), β uniform on ``betas``. Laws are drawn when the search first asks
    for them (deferred decisions: the same joint law as drawing all of them up front). μ, μ₂ from
    ``moment_draws`` fresh laws. Per environment the slope of E* vs ln P is fitted; its mean ± SE is
    compared with 1/μ. The moment draws and every environment e draw from streams of their own
    (:mod:`specbound.seeds`)."""
    rng = np.random.default_rng(derive_seed(seed, "pankratov T4 moments"))
    t0 = time.perf_counter()
    draws = np.stack([_random_law(rng, vocab, betas) for _ in range(moment_draws)])
    H, m2 = entropy_moments(draws)
    mu, mu2, mean_H2 = float(H.mean()), float(m2.mean()), float((H * H).mean())
    del draws
    P = _grid(p_min, p_max, 40)
    curves = np.empty((n_envs, p_max))
    for e in range(n_envs):
        env_rng = np.random.default_rng(derive_seed(seed, "pankratov T4 environment", e))
        tree = optimal_tree(lambda path, r=env_rng: _random_law(r, vocab, betas), p_max)
        run = np.cumsum(np.asarray(tree.path_probs, dtype=np.float64))
        curves[e, : run.size] = run
        curves[e, run.size:] = run[-1] if run.size else 0.0
    slopes = np.array([fit_log_slope(P, c[P - 1]) for c in curves])
    slope, slope_se = float(slopes.mean()), float(slopes.std(ddof=1) / math.sqrt(n_envs)) if n_envs > 1 else 0.0
    mean_curve = curves.mean(axis=0)
    renewal_holds, published_holds = _checks(mean_curve, mu, mu2, p_max)
    return SyntheticCase(
        name=f"T4 random softmax(βg), V={vocab}, β∈{{{', '.join(f'{b:g}' for b in betas)}}}", kind="random",
        mu=mu, mu2=mu2, mean_H2=mean_H2, P=P.tolist(), value=mean_curve[P - 1].tolist(),
        value_se=(curves[:, P - 1].std(axis=0, ddof=1) / math.sqrt(n_envs)).tolist() if n_envs > 1 else None,
        asymptotic=speed_of_light(mu, mu2, P, "asymptotic").tolist(), renewal=speed_of_light(mu, mu2, P, "renewal").tolist(),
        slope=slope, slope_se=slope_se, inverse_mu=1.0 / mu, relative_error=slope * mu - 1.0,
        within_tolerance=bool(abs(slope * mu - 1.0) <= SLOPE_TOLERANCE), renewal_holds=renewal_holds,
        published_holds_P_ge_3=published_holds, n_envs=n_envs, moment_draws=moment_draws,
        p_range=[int(p_min), int(p_max)],
        checkpoints={c: float(mean_curve[c - 1]) for c in (64, 256, 1024, 4096) if c <= p_max},
        seconds=time.perf_counter() - t0)


def synthetic_checks(quick: bool = False, seed: int = 0) -> SyntheticChecks:
    """(iii): every identical case of :data:`IDENTICAL_CASES` and the random environment."""
    p_max = 2 ** 14 if quick else 2 ** 16
    cases = [identical_environment_case(name, law, p_max) for name, law in IDENTICAL_CASES]
    cases.append(random_environment_case(n_envs=60 if quick else 300, p_max=1024 if quick else 4096,
                                         moment_draws=30_000 if quick else 200_000, seed=seed))
    return SyntheticChecks(cases=cases, tolerance=SLOPE_TOLERANCE,
                           all_within_tolerance=all(c.within_tolerance for c in cases),
                           all_bounds_hold=all(c.renewal_holds and c.published_holds_P_ge_3 for c in cases))


# ---------------------------------------------------------------------------------------------------
# (i) the moments table, (ii) Fig. 2 in kind
# ---------------------------------------------------------------------------------------------------
@dataclass
class MomentRow:
    """One row of the moments table: a model's estimate on one prompt set."""

    model: str
    set: str
    moments: MomentEstimate

    @classmethod
    def _upgrade_json(cls, data: dict) -> dict:
        """Rows written before the estimate was one record held its fields flat beside model and set."""
        if "moments" in data or "mu" not in data:
            return data
        names = {f.name for f in fields(MomentEstimate)}
        return {"model": data.get("model"), "set": data.get("set"),
                "moments": {k: v for k, v in data.items() if k in names}}


def moments_table(model, model_name: str, prompts_by_set: dict, cfg: AnalyzeConfig, progress=None, log=print,
                  journal: PartialResults | None = None) -> list[MomentRow]:
    """μ, μ₂, E[H²] of ``model`` on its own samples for every prompt set (the Table in kind)."""
    rows = []
    for set_name, prompts in prompts_by_set.items():
        ids = encode_prompts(model, prompts)
        mom = measure_moments(model, ids, cfg.tokens, cfg.temperature, cfg.seed, progress,
                              label=f"{set_name} moments {model_name}", journal=journal,
                              key=f"table/{model_name}/{set_name}")
        est = mom.estimate
        log(f"[table] {model_name} × {set_name}: mu={est.mu:.4f} mu2={est.mu2:.4f} "
            f"E[H^2]={est.mean_H2:.4f} n={est.n} ({mom.seconds:.0f}s)")
        rows.append(MomentRow(model=model_name, set=set_name, moments=est))
    return rows


#: Sizes of the full run per prompt set, chosen for the oracle's precision target (SE of E[X*](P) ≤ 5%
#: of its value at P = 4, 16, 64, the texts of one prompt as one unit). Most of the variance is between
#: prompts (docs/reproductions.md, "sizing"), so the run spends its time on many prompts with one or two
#: positions each: the 2026-12-05 variance split (16 texts × 6 positions) predicts ≈ 4.2% (HumanEval,
#: P = 64), 3.6–5.1% (MT-Bench, 80 questions × 2 texts × 2 positions; the upper end if texts of one
#: question were fully correlated), ≈ 3.6% (GSM8K). MT-Bench has only 80 first-turn questions, hence
#: its second text per question.
FULL_SET_SIZES = {
    "humaneval": dict(n_prompts=160, oracle_positions=240),
    "mtbench": dict(n_prompts=80, texts_per_prompt=2, oracle_positions=320),
    "gsm8k": dict(n_prompts=96, oracle_positions=128),
}
#: The draft's own moments (the model-order claims) are measured on the first prompts of each set only.
DRAFT_TABLE_PROMPTS = 32


def llm_configs(quick: bool) -> tuple[AnalyzeConfig, tuple[str, ...]]:
    """(base configuration, sets analysed for Fig. 2); :func:`set_config` gives each set's sizes. The
    moments table always covers all of :data:`SETS`."""
    if quick:
        cfg = AnalyzeConfig.quick(n_prompts=1, tokens=8, capacities=(1, 4, 8), oracle_positions=1,
                                  oracle_sd_capacities=(4,), oracle_sd_tokens=8, drafter_prompts=1,
                                  drafter_tokens=8, cost_repeats=1)
        return cfg, SETS[:1]
    # full run (kquant target compiled, int8 draft, 2 cores, quiet machine). One T*(64) costs 1-4 s
    # (pruned prefetch, the sampled continuation read as one chain), a sampled text of 24 tokens ~2 s,
    # exact drafter values 5-7 s per position.
    cfg = AnalyzeConfig(n_prompts=16, tokens=24, capacities=(1, 2, 4, 8, 16, 32, 64), oracle_positions=96,
                        drafter_positions=12, oracle_width=12, oracle_sd_capacities=(1, 8, 64), oracle_sd_prompts=1,
                        oracle_sd_tokens=24, drafter_prompts=1, drafter_tokens=32, cost_repeats=3)
    return cfg, SETS


def set_config(cfg: AnalyzeConfig, set_name: str, quick: bool) -> AnalyzeConfig:
    """The configuration one prompt set runs with: ``cfg`` and, in a full run, :data:`FULL_SET_SIZES`."""
    return cfg if quick else replace(cfg, **FULL_SET_SIZES.get(set_name, {}))


@dataclass
class LLMStudy:
    analyses: list[SetAnalysis]
    table: list[MomentRow]
    timings: dict[str, float] = field(default_factory=dict)
    skipped_models: list[str] = field(default_factory=list)
    torch_threads: int = 1
    target_precision: str = "fp32"                # runs written before the int8 target was the default
    target_kernels: str | None = omitted_if_none()


@dataclass
class Augmented:
    finished: str
    seconds: float


@dataclass
class PankratovResult:
    """Everything ``reproduce pankratov`` measured (JSON: ``results.json``); ``llm`` is None when the
    real-model parts were skipped (``llm_note`` says why)."""

    quick: bool
    synthetic: SyntheticChecks
    llm: LLMStudy | None
    paper: str = PAPER
    claims: Claims | None = omitted_if_none()
    llm_note: str | None = omitted_if_none()
    llm_config: AnalyzeConfig | None = omitted_if_none()
    seconds: float = 0.0
    finished: str = ""
    augmented: Augmented | None = omitted_if_none()


@dataclass
class Settings:
    """What ``reproduce pankratov`` runs: the quick sizes or the full ones (:func:`llm_configs`), with or
    without the real-model parts."""

    quick: bool = False
    skip_llm: bool = False
    target_precision: str = "kquant"       # the target measured: the packaged GGUF's K-quants (generate's default)

    def llm_config(self) -> tuple[AnalyzeConfig, tuple[str, ...]]:
        """(configuration of the real-model parts, sets analysed for Fig. 2): :func:`llm_configs`."""
        return llm_configs(self.quick)

    def set_sizes(self) -> dict[str, AnalyzeConfig]:
        """Each prompt set's configuration (:func:`set_config`)."""
        cfg, _ = self.llm_config()
        return {s: set_config(cfg, s, self.quick) for s in SETS}


def run(settings: Settings, progress: bool = True, journal: PartialResults | None = None,
        log=print) -> PankratovResult:
    """The study: (iii) the synthetic checks, then (i) the moments table and (ii) Fig. 2 in kind on the
    packaged pair (every unit through ``journal``, for ``--resume``) unless ``settings.skip_llm`` or the
    pair is missing (``llm_note`` says which)."""
    t0 = time.perf_counter()
    log("== (iii) synthetic i.i.d. checks")
    synthetic = synthetic_checks(settings.quick)
    for c in synthetic.cases:
        log(f"   {c.name}: slope {c.slope:.4f} vs 1/mu {c.inverse_mu:.4f} ({c.relative_error:+.2%})")
    result = PankratovResult(quick=settings.quick, synthetic=synthetic, llm=None)
    if settings.skip_llm:
        result.llm_note = "--skip-llm was given"
    else:
        ok, why = default_pair_status(settings.target_precision)
        if not ok:
            result.llm_note = why
        else:
            cfg, fig_sets = settings.llm_config()
            result.llm_config = cfg
            result.llm = run_llm(cfg, fig_sets, progress, log=log, journal=journal,
                                 precision=settings.target_precision, quick=settings.quick)
            result.claims = claims(result.llm)
    result.seconds = time.perf_counter() - t0
    result.finished = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return result


def run_llm(cfg: AnalyzeConfig, fig_sets, progress: bool, log=print,
            journal: PartialResults | None = None, precision: str = "kquant", quick: bool = True) -> LLMStudy:
    """(i) and (ii) on the packaged models (loads them — the target at ``precision``, compiled when it is
    quantised, and the int8 draft; every unit goes through ``journal``); each set with
    :func:`set_config` (the full sizes unless ``quick``), the draft's table on its first
    :data:`DRAFT_TABLE_PROMPTS` prompts."""
    import torch

    journal = journal if journal is not None else no_journal()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    configs = {s: set_config(cfg, s, quick) for s in SETS}
    prompts_by_set = {s: load_prompts(s, configs[s].n_prompts) for s in SETS}
    table_prompts = {s: p[:DRAFT_TABLE_PROMPTS] for s, p in prompts_by_set.items()}   # the other models' table
    t0 = time.perf_counter()
    target = model_loading.load_model(DEFAULT_TARGET, progress=progress, precision=precision,
                                      compiled=precision != "fp32")
    draft8 = model_loading.load_model(DEFAULT_DRAFT, progress=progress, int8=True)
    timings["load_target_and_int8_draft"] = time.perf_counter() - t0
    target_kernels = target.info.kernels
    analyses, table_rows = [], []
    target_label = f"{DEFAULT_TARGET} (target)"
    for s in SETS:
        if s in fig_sets:
            log(f"== analysing {s} (moments, oracle, drafters, costs)")
            res = analyze_set(target, draft8, s, configs[s], prompts=prompts_by_set[s], progress=progress, log=log,
                              journal=journal)
            analyses.append(res)
            table_rows.append(MomentRow(model=target_label, set=s, moments=res.moments))
            timings[f"analyze_{s}"] = sum(res.timings.values())
        else:
            with progress_bar(progress) as bar:
                table_rows += moments_table(target, target_label, {s: prompts_by_set[s]}, configs[s],
                                            bar if progress else None, log, journal)
    del target
    gc.collect()
    t0 = time.perf_counter()
    with progress_bar(progress) as bar:          # the draft the analyses used, on its own samples
        table_rows += moments_table(draft8, f"{DEFAULT_DRAFT} (draft, int8)", table_prompts, cfg,
                                    bar if progress else None, log, journal)
    del draft8
    gc.collect()
    timings[f"table_{DEFAULT_DRAFT}"] = time.perf_counter() - t0
    others = []
    skipped = []
    if asset_models.is_converted("smollm2-135m"):
        others.append(("smollm2-135m", "smollm2-135m"))
    else:
        skipped.append("smollm2-135m (not converted)")
    for name, label in others:
        t0 = time.perf_counter()
        model = model_loading.load_model(name, progress=progress)
        with progress_bar(progress) as bar:
            table_rows += moments_table(model, label, table_prompts, cfg, bar if progress else None, log, journal)
        del model
        gc.collect()
        timings[f"table_{name}"] = time.perf_counter() - t0
    timings["llm_total"] = time.perf_counter() - t_start
    return LLMStudy(analyses=analyses, table=table_rows, timings=timings, skipped_models=skipped,
                    torch_threads=torch.get_num_threads(), target_precision=precision, target_kernels=target_kernels)


def augment(result: PankratovResult, progress: bool = True, log=print) -> PankratovResult:
    """Add the exact per-position drafter values (:func:`.drafter_values.drafter_values`) to a finished
    run that predates them (same prompts, samples and oracle positions); derived parts recomputed."""
    if result.llm is None:
        raise SpecboundError("the results in --out have no LLM part to augment")
    t0 = time.perf_counter()
    target = model_loading.load_model(DEFAULT_TARGET, progress=progress, precision=result.llm.target_precision)
    draft = model_loading.load_model(DEFAULT_DRAFT, progress=progress, int8=True)
    for res in result.llm.analyses:
        if res.drafter_exact is not None or res.oracle is None:
            continue
        cfg = res.config
        ids = encode_prompts(target, load_prompts(res.set, cfg.n_prompts))
        for p, length in zip(ids, res.prompt_ids_lengths):
            if len(p) != length:
                raise SpecboundError(f"{res.set}: a prompt encodes to {len(p)} tokens, the run had {length}")
        for i, sample in enumerate(res.samples):
            sample.prompt = ids[sample.prompt_index if sample.prompt_index >= 0 else i]
        positions = [(d.sample, d.position) for d in res.oracle.positions]
        t1 = time.perf_counter()
        with progress_bar(progress) as bar:
            res.drafter_exact = drafter_values(target, draft, res.samples, positions, cfg.capacities, cfg.temperature,
                                               cfg.seed, bar if progress else None)
        res.drafter_exact.oracle_indices = list(range(len(positions)))
        res.timings["drafter_exact"] = time.perf_counter() - t1
        res.finalize()
        log(f"[{res.set}] exact E[X|T] at the oracle positions: " + "; ".join(
            f"{kind}: " + ", ".join(f"P={c}: {m:.2f}" for c, m in zip(cfg.capacities, res.drafter_exact.of(kind).mean))
            for kind in ("dynamic", "chain")) + f"  ({res.timings['drafter_exact']:.0f}s)")
    result.augmented = Augmented(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), time.perf_counter() - t0)
    return result


# ---------------------------------------------------------------------------------------------------
# claims: every real-model finding with an interval and a verdict
# ---------------------------------------------------------------------------------------------------
#: Capacities at which the oracle's precision target (SE ≤ 5% of E[X*](P)) is checked.
PRECISION_P = (4, 16, 64)
PRECISION_TARGET = 0.05


@dataclass
class Interval:
    """A measured value, its standard error and the normal 95% interval."""

    value: float
    se: float
    lo: float = float("nan")
    hi: float = float("nan")

    def __post_init__(self):
        if math.isfinite(self.value) and math.isfinite(self.se):
            self.lo, self.hi = self.value - Z95 * self.se, self.value + Z95 * self.se


@dataclass
class OraclePrecision:
    """Is E[X*](P) measured to within :data:`PRECISION_TARGET` (SE by sampled text / value)?"""

    set: str
    positions: int
    samples: int
    P: list[int]
    value: list[float]
    se_by_sample: list[float]
    relative_se: list[float]
    target_met: bool
    prompts: int = 0                # the units of the SE (texts of one prompt are one unit)
    # where the error comes from (:func:`~specbound.measure.stats.variance_split`, per P): variance
    # between prompts and within one prompt's positions; the set's size; the smallest SE/value any
    # number of texts or positions can reach with every prompt of the set (σ_b / √set_prompts / value);
    # prompts needed, one position each, for the target (σ_b² + σ_w²) / (target · value)²
    between_var: list[float] = field(default_factory=list)
    within_var: list[float] = field(default_factory=list)
    set_prompts: int = 0
    floor_relative_se: list[float] = field(default_factory=list)
    prompts_for_target: list[float] = field(default_factory=list)


@dataclass
class SlopeClaim:
    """Pankratov & Alistarh's asymptotics (§3.3): E[X*] grows like ln P / μ. The oracle's fitted slope
    against ln P beside 1/μ of the same target on the same set, and slope·μ (1 under the i.i.d. model)."""

    set: str
    capacities: list[int]
    slope: Interval
    inverse_mu: Interval
    slope_times_mu: Interval
    verdict: str


@dataclass
class OrderClaim:
    """A paper direction between two measured things (a, b): ``diff`` = quantity(a) − quantity(b)."""

    claim: str
    a: str
    b: str
    quantity: str
    a_value: Interval
    b_value: Interval
    diff: Interval
    verdict: str


@dataclass
class BoundClaim:
    """Do the rigorous bounds stay above the oracle (the bound is on E[X*]: checked against its 95% limits)?"""

    set: str
    verdict: str
    worst_P: int
    worst_margin_se: float          # (tightest rigorous bound − oracle mean) / SE at the closest P


@dataclass
class Claims:
    oracle_precision: list[OraclePrecision]
    slopes: list[SlopeClaim]
    set_order: list[OrderClaim]
    model_order: list[OrderClaim]
    bounds: list[BoundClaim]
    decided: int = 0
    total: int = 0


def _diff(a: Interval, b: Interval) -> Interval:
    return Interval(a.value - b.value, math.sqrt(a.se ** 2 + b.se ** 2))


def _sign(x: Interval) -> int:
    """+1 / −1 when the 95% interval excludes 0 on that side, else 0."""
    return 1 if x.lo > 0 else -1 if x.hi < 0 else 0


def slope_claim(analysis: SetAnalysis) -> SlopeClaim:
    """The oracle's slope against ln P (mean of per-position slopes, SE by sampled text) vs 1/μ (SE by
    the delta method from μ's per-prompt SE). slope·μ's SE treats the two as independent (they are
    measured on the same texts; the covariance is left out)."""
    o, mu = analysis.oracle, _mu(analysis.moments)
    slope = Interval(o.slope, o.slope_se)
    inv = Interval(1.0 / mu.value, mu.se / mu.value ** 2)
    r = o.slope * mu.value
    ratio = Interval(r, abs(r) * math.sqrt((o.slope_se / o.slope) ** 2 + (mu.se / mu.value) ** 2)
                     if o.slope else float("nan"))
    if not math.isfinite(ratio.se):
        verdict = "not decided (no interval)"
    elif ratio.hi < 1:
        verdict = f"slope < 1/μ at 95% (slope·μ = {r:.2f})"
    elif ratio.lo > 1:
        verdict = f"slope > 1/μ at 95% (slope·μ = {r:.2f})"
    else:
        verdict = f"consistent with 1/μ at 95% (slope·μ = {r:.2f}, interval {ratio.lo:.2f}–{ratio.hi:.2f})"
    return SlopeClaim(analysis.set, list(o.slope_capacities), slope, inv, ratio, verdict)


def _mu(m: MomentEstimate, second: bool = False) -> Interval:
    value, se_prompt, se = (m.mu2, m.se_mu2_prompt, m.se_mu2) if second else (m.mu, m.se_mu_prompt, m.se_mu)
    return Interval(value, se_prompt if math.isfinite(se_prompt) else se)


def set_order_claims(analyses: list[SetAnalysis]) -> list[OrderClaim]:
    """The paper's reading of μ: a set with lower μ has more parallelisation headroom. For each pair of
    sets: confirmed when μ and E[X*](P_max) both differ at 95% in opposite directions, contradicted when
    both differ in the same direction, otherwise not decided."""
    out = []
    for i, a in enumerate(analyses):
        for b in analyses[i + 1:]:
            if a.oracle is None or b.oracle is None:
                continue
            pmax = max(a.oracle.capacities)
            if pmax not in b.oracle.capacities:
                continue
            j, k = a.oracle.capacities.index(pmax), b.oracle.capacities.index(pmax)
            mu_d = _diff(_mu(a.moments), _mu(b.moments))
            xa = Interval(a.oracle.mean[j], a.oracle.se_by_sample[j])
            xb = Interval(b.oracle.mean[k], b.oracle.se_by_sample[k])
            x_d = _diff(xa, xb)
            s_mu, s_x = _sign(mu_d), _sign(x_d)
            lower = a.set if mu_d.value < 0 else b.set
            if s_mu and s_x and s_mu != s_x:
                verdict = f"confirmed at 95%: {lower} has the lower μ and the larger E[X*]({pmax})"
            elif s_mu and s_x:
                verdict = f"contradicted at 95%: {lower} has the lower μ but the smaller E[X*]({pmax})"
            else:
                verdict = ("not decided: " + ("μ" if not s_mu else "") + (" and " if not s_mu and not s_x else "")
                           + (f"E[X*]({pmax})" if not s_x else "") + " not separated at 95%")
            out.append(OrderClaim("lower μ ↔ larger E[X*]", a.set, b.set, f"μ; E[X*]({pmax})",
                                  _mu(a.moments), _mu(b.moments), mu_d, verdict))
            out.append(OrderClaim("lower μ ↔ larger E[X*]", a.set, b.set, f"E[X*]({pmax})", xa, xb, x_d, verdict))
    return out


def model_order_claims(table: list[MomentRow], larger: str, smaller: str) -> list[OrderClaim]:
    """The paper's model finding: the larger model has lower (and more stable) μ and μ₂. Per set, the
    larger model's μ and μ₂ against the smaller one's (each on its own samples), decided at 95%."""
    out = []
    rows = {(r.model.split(" ")[0], r.set): r.moments for r in table}
    for s in SETS:
        big, small = rows.get((larger, s)), rows.get((smaller, s))
        if big is None or small is None:
            continue
        for second, name in ((False, "μ"), (True, "μ₂")):
            a, b = _mu(big, second), _mu(small, second)
            d = _diff(a, b)
            sign = _sign(d)
            verdict = (f"larger model lower {name} at 95%" if sign < 0 else
                       f"larger model HIGHER {name} at 95% (against the paper's direction)" if sign > 0 else
                       f"not decided: {name} not separated at 95%")
            out.append(OrderClaim(f"larger model, lower {name}", f"{larger} ({s})", f"{smaller} ({s})", name, a, b, d,
                                  verdict))
    return out


def bound_claim(analysis: SetAnalysis) -> BoundClaim:
    """The tightest rigorous bound per P against the oracle: holds at 95% when it is above the oracle's
    upper 95% limit at every P, violated when below the lower limit at some P."""
    o = analysis.oracle
    worst_P, worst = 0, float("inf")
    violated = undecided = False
    for j, P in enumerate(o.capacities):
        entry = analysis.tightest_bound.get(P)
        if entry is None:
            continue
        se = o.se_by_sample[j]
        margin = (entry.value - o.mean[j]) / se if se and math.isfinite(se) and se > 0 else float("inf")
        if margin < worst:
            worst_P, worst = P, margin
        violated |= margin < -Z95
        undecided |= -Z95 <= margin <= Z95
    verdict = ("violated at 95%" if violated else "not decided at 95% (a bound within 1.96 SE of the oracle)"
               if undecided else "every rigorous bound above the oracle at 95%, at every P")
    return BoundClaim(analysis.set, verdict, worst_P, worst)


def oracle_precision(analysis: SetAnalysis) -> OraclePrecision:
    o = analysis.oracle
    Ps = [P for P in PRECISION_P if P in o.capacities]
    idx = [o.capacities.index(P) for P in Ps]
    value = [o.mean[j] for j in idx]
    se = [o.se_by_sample[j] for j in idx]
    rel = [s / v if v else float("nan") for s, v in zip(se, value)]
    units = [p.unit for p in o.positions]
    arr = o.table()
    split = [variance_split(arr[:, j], units) if len(units) == arr.shape[0] else (float("nan"),) * 2 for j in idx]
    set_prompts = _set_size(analysis.set)
    floor = [math.sqrt(b / set_prompts) / v if set_prompts and v and math.isfinite(b) else float("nan")
             for (b, _), v in zip(split, value)]
    needed = [(b + w) / (PRECISION_TARGET * v) ** 2 if v else float("nan") for (b, w), v in zip(split, value)]
    return OraclePrecision(analysis.set, o.n_positions, o.n_samples, Ps, value, se, rel,
                           bool(rel) and all(math.isfinite(r) and r <= PRECISION_TARGET for r in rel),
                           prompts=o.n_clusters or o.n_samples, between_var=[b for b, _ in split],
                           within_var=[w for _, w in split], set_prompts=set_prompts, floor_relative_se=floor,
                           prompts_for_target=needed)


def _set_size(name: str) -> int:
    """How many prompts the packaged set holds (0 when its package is missing or the name unknown)."""
    try:
        return len(load_prompts(name, strict=True))
    except SpecboundError:                                 # ModelNotAvailable is one: a report still renders
        return 0


def claims(llm: LLMStudy) -> Claims:
    """Every real-model claim of the reproduction with its interval and verdict (see the dataclasses)."""
    with_oracle = [a for a in llm.analyses if a.oracle is not None and a.oracle.n_positions > 1]
    out = Claims(oracle_precision=[oracle_precision(a) for a in with_oracle],
                 slopes=[slope_claim(a) for a in with_oracle], set_order=set_order_claims(with_oracle),
                 model_order=model_order_claims(llm.table, DEFAULT_TARGET, DEFAULT_DRAFT),
                 bounds=[bound_claim(a) for a in with_oracle])
    verdicts = ([c.verdict for c in out.slopes] + [c.verdict for c in out.set_order[::2]]
                + [c.verdict for c in out.model_order] + [c.verdict for c in out.bounds])
    out.total = len(verdicts)
    out.decided = sum(not v.startswith("not decided") for v in verdicts)
    return out
