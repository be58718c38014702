"""`specbound reproduce yin`: Yin et al. 2024 (NeurIPS), Fig. 2-4 and Table 1, in kind.

* Fig. 2 — a random 7-state non-stationary chain, T = 50: (a) running Monte Carlo average of N_rej
  for speculative decoding (SD, Alg. 1) against Thm 1; (b) the same for batch SD with M = 4, 5
  (design B) against Thm 3, with the exact values of design A (prefix-tree DFS: a derived variant, not
  the paper's statement — its rejections keep falling toward 0 as M grows, unlike Prop. 1); (c) E[N_rej]
  against M = 1..20 (designs A and B exact, Monte Carlo points, Prop. 1 limit of design B). The Monte Carlo is the vectorised
  NumPy simulator :func:`~specbound.theory.simulate_batch_rejections`; the real decoding engine
  (:func:`~specbound.decoding.speculative_decode` on :class:`~specbound.models.ChainModel` s) is
  run for fewer runs as a cross-check.
* Fig. 3 — batch improvement TV − ρ_M against M for Bernoulli and uniform pairs: closed forms
  against the recursive residual chain.
* Fig. 4 — Pareto front of over-acceptance on a random V = 10 instance: the line rej + bias = TV
  (Thm 5), the unattainable region below it, Decoding-OPT points (on the line, both ε forms),
  Decoding-UNO points (above it), rejection and bias against ε; checked against an LP (Thm 4)
  and against the verification core's OPT/UNO rules by Monte Carlo.
* Table 1 in kind — Decoding-OPT against Decoding-UNO on the real pair (Qwen2.5-Coder 1.5B target,
  int8 0.5B draft) on MT-Bench prompts at ε ∈ {0.1, 0.2, 0.4, 0.8}: rejection rates (equal within
  SE), measured bias, and a win rate of OPT over UNO judged by a PROXY scorer available offline —
  the target model's own mean log-likelihood of the response (the paper used a reward model and
  GPT-4). Skipped with ``--skip-llm`` or when the models are not installed.

Outputs in ``--out``: fig2a.png, fig2b.png, fig2c.png, fig3.png, fig4.png, summary.md, results.json.
"""
from __future__ import annotations

import json
import math
import platform
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["add_arguments", "run", "Settings", "fig2_chain", "fig4_instance", "wilson_interval",
           "run_fig2", "run_fig3", "run_fig4", "run_table1", "PAPER"]

DEFAULT_OUT = "runs/reproduce-yin"
#: Numbers reported by the paper (Fig. 2a): its chain is not published, so only behaviour is compared.
PAPER = {"fig2a_expected_rejections": 16.41, "fig2a_speedup": 3.05, "horizon": 50, "states": 7}
TABLE_EPS = (0.1, 0.2, 0.4, 0.8)
#: Additive ε "saturates" when its smallest ε already removes more than this share of SD's rejections.
SATURATION_SHARE = 0.75
#: --quick must finish within 2 minutes; Table 1 gets what Fig. 2-4 leave of this.
QUICK_TOTAL_SECONDS = 105.0


# =============================================================================================== settings
@dataclass
class Settings:
    quick: bool = False
    seed: int = 0
    out: str = DEFAULT_OUT
    # Fig. 2 chain (the same construction as `specbound theory`, draft noise raised to 0.6)
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
    # Table 1
    skip_llm: bool = False
    prompt_set: str = "mtbench"
    prompts: int = 8
    samples: int = 2
    tokens: int = 32
    gamma: int = 5
    table_eps: tuple[float, ...] = TABLE_EPS
    forms: str = "auto"                         # auto | additive | ratio | both
    calibration_prompts: int = 3
    llm_budget: float | None = 24 * 60.0        # seconds for the whole Table 1 (load + calibrate + generate + score)
    llm_load_budget: float | None = None        # seconds; skip the LLM table if loading takes longer
    threads: int | None = 1                     # torch threads for the real models: 1 because the CPU is shared
                                                # (with another busy process, 2 OpenMP threads ran the 1.5B
                                                # target 3-7x slower than 1 thread on this 2-core machine)
    notes: list = field(default_factory=list)

    @classmethod
    def from_args(cls, args) -> "Settings":
        quick = bool(getattr(args, "quick", False))
        s = cls(quick=quick, seed=int(getattr(args, "seed", 0) or 0),
                out=str(getattr(args, "out", None) or DEFAULT_OUT),
                skip_llm=bool(getattr(args, "skip_llm", False)))
        if quick:
            s.mc_runs, s.curve_mc_runs = 2_000, 1_000
            s.curve_mc_drafts = (1, 2, 4, 8)
            s.engine_runs, s.engine_runs_a = 30, 0
            s.core_mc_rows = 20_000
            s.prompts, s.samples, s.tokens = 2, 1, 16
            s.table_eps = (0.1, 0.8)
            s.calibration_prompts = 1
            s.llm_load_budget = 60.0
            s.llm_budget = QUICK_TOTAL_SECONDS        # minus the time Fig. 2-4 took (see run)
        for name in ("prompts", "samples", "tokens", "gamma", "mc_runs", "engine_runs"):
            value = getattr(args, name.replace("-", "_"), None)
            if value is not None:
                setattr(s, name, int(value))
        if getattr(args, "llm_minutes", None) is not None:
            s.llm_budget = 60.0 * float(args.llm_minutes)
        if getattr(args, "threads", None) is not None:
            s.threads = int(args.threads)
        if getattr(args, "forms", None):
            s.forms = args.forms
        if getattr(args, "prompt_set", None):
            s.prompt_set = args.prompt_set
        return s


def add_arguments(parser) -> None:
    """Options of ``specbound reproduce yin``."""
    parser.add_argument("--quick", action="store_true",
                        help="small run for smoke tests (< 2 min; the LLM table is tiny or skipped)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--skip-llm", action="store_true", help="skip the real-model Table 1")
    parser.add_argument("--prompts", type=int, default=None, help="number of MT-Bench prompts for Table 1 "
                                                                  "(default 8; quick 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the chains, Monte Carlo and sampling")
    parser.add_argument("--samples", type=int, default=None, help="paired samples per prompt and ε (default 2)")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per response (default 32; quick 16)")
    parser.add_argument("--gamma", type=int, default=None, help="draft length per round in Table 1 (default 5)")
    parser.add_argument("--forms", choices=("auto", "additive", "ratio", "both"), default=None,
                        help="over-acceptance form(s) for Table 1: auto = additive, plus ratio if additive "
                             "saturates (default)")
    parser.add_argument("--mc-runs", type=int, default=None, help="NumPy Monte Carlo runs for Fig. 2a/b")
    parser.add_argument("--engine-runs", type=int, default=None, help="decoding-engine runs per Fig. 2 setting")
    parser.add_argument("--prompt-set", default=None, help="prompt set for Table 1 (default mtbench)")
    parser.add_argument("--llm-minutes", type=float, default=None,
                        help="time budget of Table 1 in minutes (default 24; quick: what is left of 105 s). "
                             "Whole (prompt, sample) units are dropped when it would be exceeded")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the real models (default 1: "
                                                                  "the CPU is shared; use 2 on an idle machine)")


# =============================================================================================== helpers
def _to_jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _to_jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    return obj


def _mean_se(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return float("nan"), float("nan")
    se = values.std(ddof=1) / math.sqrt(values.size) if values.size > 1 else float("nan")
    return float(values.mean()), float(se)


def _ratio_se(numerators, denominators) -> tuple[float, float]:
    """Pooled ratio Σa/Σb and its standard error (ratio estimator, generations as units)."""
    a = np.asarray(numerators, dtype=np.float64)
    b = np.asarray(denominators, dtype=np.float64)
    if a.size == 0 or b.sum() == 0:
        return float("nan"), float("nan")
    ratio = a.sum() / b.sum()
    if a.size < 2:
        return float(ratio), float("nan")
    resid = a - ratio * b
    se = math.sqrt((resid ** 2).sum() / (a.size * (a.size - 1))) / b.mean()
    return float(ratio), float(se)


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (successes may be fractional: ties count ½)."""
    if n <= 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _checkpoints(samples: np.ndarray, points: int = 60) -> dict:
    n = len(samples)
    idx = np.unique(np.geomspace(1, n, points).astype(int))
    running = np.cumsum(samples, dtype=np.float64) / np.arange(1, n + 1)
    return {"runs": idx, "running_mean": running[idx - 1]}


def _note(message: str) -> None:
    """A timestamped line on stderr when it is not a terminal (nohup logs: rich bars draw only at the end)."""
    import sys

    if not sys.stderr.isatty():
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _progress(console=None, enabled: bool = True):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not enabled,
                    transient=False)


# =============================================================================================== Fig. 2
def fig2_chain(seed: int = 0, states: int = 7, horizon: int = 50, concentration: float = 0.5,
               draft_noise: float = 0.6):
    """The Fig. 2 instance: target = random non-stationary chain (Dirichlet rows), draft = target rows
    mixed with random rows (weight ``draft_noise``). Returns (target, draft)."""
    from ..theory import MarkovChain

    target = MarkovChain.random(states, horizon=horizon, concentration=concentration, seed=seed)
    draft = target.perturbed(draft_noise, seed=seed + 1)
    return target, draft


class _torch_threads:
    """Temporarily set torch's intra-op threads (1 for the tiny chain models: on a loaded 2-core box
    OpenMP spinning makes 2 threads 5-50x slower than 1 for such small tensors)."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        import torch

        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.old)


def _engine_rejections(target, draft, horizon, drafts, design, runs, seed, progress=None, task=None) -> np.ndarray:
    """N_rej of the real decoding engine on ChainModels (drafting to the horizon), ``runs`` times."""
    from ..decoding import speculative_decode
    from ..models import ChainModel

    target_model, draft_model = ChainModel(target, "target-chain"), ChainModel(draft, "draft-chain")
    rng = np.random.default_rng([seed, 77, drafts, ord(design)])
    initial = rng.choice(target.n_states, size=runs, p=target.initial)
    out = np.empty(runs, dtype=np.int64)
    for i in range(runs):
        res = speculative_decode(target_model, draft_model, [int(initial[i])], horizon, gamma=None,
                                 drafts=None if drafts == 1 else drafts, design=design,
                                 seed=seed * 1_000_003 + 7919 * drafts + i)
        out[i] = res.metrics.rejections
        if progress is not None:
            progress.advance(task)
    return out


def run_fig2(s: Settings, progress=None) -> tuple[dict, dict]:
    """Fig. 2 numbers (JSON-ready) and the raw samples needed for the plots."""
    from ..theory import expected_rejections, simulate_batch_rejections
    from ..theory.rejections import batch_expected_rejections, batch_rejections_limit

    target, draft = fig2_chain(s.seed, s.states, s.horizon, s.concentration, s.draft_noise)
    T = s.horizon
    exact_sd = expected_rejections(target=target, draft=draft, horizon=T)
    raw: dict = {}
    out: dict = {"chain": {"states": s.states, "horizon": T, "concentration": s.concentration,
                           "draft_noise": s.draft_noise, "target_seed": s.seed, "draft_seed": s.seed + 1,
                           "construction": "target = MarkovChain.random(states, horizon, concentration, seed); "
                                           "draft = target.perturbed(draft_noise, seed + 1)"}}

    def mc(drafts, design, runs):
        samples = simulate_batch_rejections(
            target=target, draft=draft, horizon=T, drafts=drafts, design=design, n_runs=runs,
            seed=np.random.default_rng([s.seed, 11, drafts, ord(design), runs]))
        mean, se = _mean_se(samples)
        return samples, {"mean": mean, "se": se, "runs": runs}

    settings = [(1, "B")] + [(m, "B") for m in (4, 5)] + [(m, "A") for m in (4, 5)]
    engine_plan = [(1, "B", s.engine_runs), (4, "B", s.engine_runs), (5, "B", s.engine_runs)]
    if s.engine_runs_a:
        engine_plan += [(4, "A", s.engine_runs_a), (5, "A", s.engine_runs_a)]
    engine_plan = [p for p in engine_plan if p[2] > 0]
    task = None
    if progress is not None:
        task = progress.add_task("Fig. 2 NumPy Monte Carlo", total=len(settings) + 2 * len(s.curve_mc_drafts))
    rows = {}
    for drafts, design in settings:
        exact = exact_sd if drafts == 1 else batch_expected_rejections(target=target, draft=draft, horizon=T,
                                                                       drafts=drafts, design=design)
        samples, stats = mc(drafts, design, s.mc_runs)
        key = "sd" if drafts == 1 else f"M{drafts}{design}"
        raw[key] = samples
        rows[key] = {"drafts": drafts, "design": design if drafts > 1 else "-", "exact": exact,
                     "speedup": T / exact, "numpy_mc": stats,
                     "numpy_z": (stats["mean"] - exact) / stats["se"],
                     "running": _checkpoints(samples),
                     "formula": "Thm 1" if drafts == 1 else
                     "Thm 3 (design B recursion)" if design == "B" else
                     "design A recursion (derived variant, not Thm 3)"}
        if progress is not None:
            progress.advance(task)
    # Fig. 2c: E[N_rej] against M
    curve_b = [exact_sd if m == 1 else batch_expected_rejections(target=target, draft=draft, horizon=T, drafts=m,
                                                                 design="B") for m in s.curve_drafts]
    curve_a = [exact_sd if m == 1 else batch_expected_rejections(target=target, draft=draft, horizon=T, drafts=m,
                                                                 design="A") for m in s.curve_drafts]
    limit = batch_rejections_limit(target=target, draft=draft, horizon=T)
    points = []
    for design in ("B", "A"):
        for m in s.curve_mc_drafts:
            if design == "A" and m == 1:
                if progress is not None:
                    progress.advance(task)
                continue
            samples, stats = mc(m, design, s.curve_mc_runs)
            exact = curve_b[s.curve_drafts.index(m)] if design == "B" else curve_a[s.curve_drafts.index(m)]
            points.append({"drafts": m, "design": design, **stats, "exact": exact,
                           "z": (stats["mean"] - exact) / stats["se"]})
            if progress is not None:
                progress.advance(task)
    # decoding engine cross-check
    if engine_plan and progress is not None:
        etask = progress.add_task("Fig. 2 decoding engine (ChainModel)", total=sum(p[2] for p in engine_plan))
    else:
        etask = None
    for drafts, design, runs in engine_plan:
        with _torch_threads(1):
            samples = _engine_rejections(target, draft, T, drafts, design, runs, s.seed, progress, etask)
        mean, se = _mean_se(samples)
        key = "sd" if drafts == 1 else f"M{drafts}{design}"
        rows[key]["engine"] = {"mean": mean, "se": se, "runs": runs,
                               "z": (mean - rows[key]["exact"]) / se if se and se > 0 else None}
    out["rows"] = rows
    out["curve"] = {"drafts": list(s.curve_drafts), "exact_B": curve_b, "exact_A": curve_a,
                    "limit_B": limit, "limit_speedup": T / limit, "mc_points": points,
                    "nonincreasing_B": bool(np.all(np.diff(curve_b) <= 1e-12)),
                    "nonincreasing_A": bool(np.all(np.diff(curve_a) <= 1e-12)),
                    "A_le_B": bool(np.all(np.asarray(curve_a) <= np.asarray(curve_b) + 1e-12))}
    out["paper"] = dict(PAPER)
    return out, raw


# =============================================================================================== Fig. 3
BERNOULLI_PAIRS = ((0.2, 0.6), (0.5, 0.9), (0.7, 0.2), (0.1, 0.3))     # (draft P(1) = a, target P(1) = c)
UNIFORM_PAIRS = ((10, 1), (10, 3), (10, 6), (4, 1))                  # (draft support k, target support m)


def run_fig3(s: Settings) -> dict:
    """Batch improvement TV − ρ_M of one round start: closed forms vs the recursive residual chain."""
    from ..theory.rejections import (bernoulli_all_reject, bernoulli_batch_improvement, residual_chain,
                                     uniform_all_reject, uniform_batch_improvement)

    drafts = np.asarray(s.fig3_drafts)
    mmax = int(drafts.max())
    out = {"drafts": drafts.tolist(), "bernoulli": [], "uniform": []}
    for a, c in BERNOULLI_PAIRS:
        closed = bernoulli_batch_improvement(target_p1=c, draft_p1=a, drafts=drafts)
        _, rho = residual_chain(target=np.array([1 - c, c]), draft=np.array([1 - a, a]), drafts=mmax)
        recursive = rho[1] - rho[drafts]
        rho_closed = bernoulli_all_reject(target_p1=c, draft_p1=a, drafts=drafts)
        out["bernoulli"].append({"label": f"a={a:g}, c={c:g}", "draft_p1": a, "target_p1": c, "tv": abs(c - a),
                                 "closed": closed, "recursive": recursive,
                                 "max_abs_diff": float(np.max(np.abs(closed - recursive))),
                                 "max_abs_diff_rho": float(np.max(np.abs(rho_closed - rho[drafts])))})
    for k, m in UNIFORM_PAIRS:
        closed = uniform_batch_improvement(target_support=m, draft_support=k, drafts=drafts)
        draft_law = np.full(k, 1.0 / k)
        target_law = np.zeros(k)
        target_law[:m] = 1.0 / m
        _, rho = residual_chain(target=target_law, draft=draft_law, drafts=mmax)
        recursive = rho[1] - rho[drafts]
        rho_closed = uniform_all_reject(target_support=m, draft_support=k, drafts=drafts)
        out["uniform"].append({"label": f"k={k}, m={m}", "k": k, "m": m, "tv": 1 - m / k,
                               "closed": closed, "recursive": recursive,
                               "max_abs_diff": float(np.max(np.abs(closed - recursive))),
                               "max_abs_diff_rho": float(np.max(np.abs(rho_closed - rho[drafts])))})
    out["max_abs_diff"] = max(r["max_abs_diff"] for r in out["bernoulli"] + out["uniform"])
    return out


# =============================================================================================== Fig. 4
def fig4_instance(seed: int = 0, vocab: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Random single-step instance (draft, target), both Dirichlet(1) over ``vocab`` tokens."""
    rng = np.random.default_rng([seed, 4, vocab])
    draft = rng.dirichlet(np.ones(vocab))
    target = rng.dirichlet(np.ones(vocab))
    return draft, target


def _core_mc(draft, target, eps, form, rows, seed) -> dict:
    """Monte Carlo of one relaxed step through the verification core (DecodingOPT/UNO rules of verify.py)."""
    import torch

    from ..decoding.engine import make_generator
    from ..decoding.verify import DecodingOPT, DecodingUNO, verify_chain
    from ..theory.distributions import tv

    out = {}
    vocab = len(draft)
    d = torch.from_numpy(draft).reshape(1, 1, vocab).expand(rows, 1, vocab)
    t = torch.from_numpy(target).reshape(1, 1, vocab).expand(rows, 1, vocab)
    for name, rule in (("opt", DecodingOPT(float(eps), form)), ("uno", DecodingUNO(float(eps), form))):
        gen = make_generator(seed)
        tokens = torch.multinomial(d[:, 0], 1, replacement=True, generator=gen)      # [rows, 1]
        verdict = verify_chain(tokens, d, t, gen, rule)
        emitted = torch.where(verdict.rejected, verdict.next_token, tokens[:, 0]).numpy()
        freq = np.bincount(emitted, minlength=vocab) / rows
        rej = verdict.rejected.numpy().astype(np.float64)
        out[name] = {"rejection": float(rej.mean()), "rejection_se": float(rej.std(ddof=1) / math.sqrt(rows)),
                     "empirical_bias": float(tv(freq, target)), "rows": rows}
    return out


def run_fig4(s: Settings, progress=None) -> dict:
    from ..theory.distributions import tv
    from ..theory.tradeoff import lp_minimal_bias, over_acceptance, pareto_front

    draft, target = fig4_instance(s.seed, s.vocab)
    distance = float(tv(draft, target))
    eps_points = np.asarray(s.eps_points, dtype=np.float64)
    eps_dense = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 90)])
    out = {"vocab": s.vocab, "draft": draft, "target": target, "tv": distance, "eps": eps_points,
           "instance": "draft, target ~ Dirichlet(1) from numpy default_rng([seed, 4, vocab])",
           "forms": {}, "dense": {}}
    task = progress.add_task("Fig. 4 Pareto + core MC", total=2 * len(eps_points)) if progress is not None else None
    for form in ("additive", "ratio"):
        front = pareto_front(target=target, draft=draft, eps_grid=eps_points, form=form)
        dense = pareto_front(target=target, draft=draft, eps_grid=eps_dense, form=form)
        lp = []
        core = []
        for i, eps in enumerate(eps_points):
            accept = over_acceptance(target=target, draft=draft, eps=eps, form=form)
            lp_loss, _ = lp_minimal_bias(target=target, draft=draft, accept=accept)
            lp.append(lp_loss)
            with _torch_threads(1):
                core.append(_core_mc(draft, target, eps, form, s.core_mc_rows, seed=s.seed * 1009 + i))
            if progress is not None:
                progress.advance(task)
        rej, bias, uno = front.rejection, front.bias, front.uno_bias
        has_rej = rej > 1e-12
        out["forms"][form] = {
            "rejection": rej, "opt_bias": bias, "uno_bias": uno, "lp_opt_bias": np.asarray(lp),
            "identity_max_abs_error": float(np.max(np.abs(rej + bias - distance))),
            "lp_max_abs_error": float(np.max(np.abs(np.asarray(lp) - bias))),
            "uno_min_excess_where_rejecting": float(np.min((uno - bias)[has_rej])) if has_rej.any() else None,
            "core_mc": core,
        }
        out["dense"][form] = {"eps": eps_dense, "rejection": dense.rejection, "opt_bias": dense.bias,
                              "uno_bias": dense.uno_bias}
    return out


# =============================================================================================== Table 1
def _tracked_rule(method: str, eps: float, form: str):
    """Decoding-OPT / -UNO rule that also adds up, over the verified positions, the exact rejection
    probability 1 − Σ draft·b of each position given its prefix (and its Bernoulli variance).

    It hooks :meth:`RelaxedAcceptance.step_bias`, which the relaxed engine calls once per round with the
    processed laws of exactly the verified positions (see ``RelaxedChainSpeculator.verify``), so the
    sum uses the laws the engine itself verified with. Decisions are unchanged. Because whether a
    position is verified depends only on the past, Σ(1[rejected] − P(reject | prefix)) is a martingale:
    E[rejections] = E[Σ P(reject | prefix)] exactly (Yin et al. 2024, Thm 5's rejection 1 − Σ draft·b).
    """
    from ..decoding.verify import DecodingOPT, DecodingUNO

    base = {"opt": DecodingOPT, "uno": DecodingUNO}[method]

    class Tracked(base):
        def __init__(self, eps, form):
            super().__init__(eps, form)
            self.exact_rejection, self.exact_variance = 0.0, 0.0

        def step_bias(self, target_probs, draft_probs):
            # float64: 1 − Σ over ~150k float32 products would carry rounding errors of ~1e-4 per position
            t64, d64 = target_probs.double(), draft_probs.double()
            d64 = d64 / d64.sum(-1, keepdim=True)
            t64 = t64 / t64.sum(-1, keepdim=True)
            accept = self.acceptance(t64, d64)
            p_reject = (1.0 - (d64 * accept).sum(-1)).clamp(0.0, 1.0)
            self.exact_rejection += float(p_reject.sum())
            self.exact_variance += float((p_reject * (1.0 - p_reject)).sum())
            return super().step_bias(target_probs, draft_probs)

    Tracked.__name__ = Tracked.__qualname__ = f"Tracked{base.__name__}"
    return Tracked(float(eps), form)


def _llm_status() -> tuple[bool, str]:
    """(available, note) for the default real pair; never raises."""
    try:
        from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET, is_converted
    except Exception as exc:  # transformers / torch stack missing
        return False, f"real-model stack not importable ({type(exc).__name__}: {exc})"
    try:
        missing = [name for name in (DEFAULT_TARGET, DEFAULT_DRAFT) if not is_converted(name)]
    except Exception as exc:
        return False, f"could not check the model cache ({type(exc).__name__}: {exc})"
    if missing:
        return False, (f"real models not available on this machine (not converted: {', '.join(missing)}; "
                       "run `python -m specbound.assets convert --install` to enable Table 1)")
    return True, "ok"


def _stop_ids(tokenizer) -> set[int]:
    ids = set()
    if tokenizer is None:
        return ids
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid >= 0 and tid != getattr(tokenizer, "unk_token_id", None):
            ids.add(tid)
    return ids


def _truncate(tokens: list[int], stops: set[int]) -> list[int]:
    for i, tok in enumerate(tokens):
        if tok in stops:
            return tokens[:i + 1]
    return tokens


def _laws_along(model, prompt_ids: list[int], response: list[int]) -> np.ndarray:
    """Processed (temperature 1) laws before each response token, float64 [L, V]."""
    import torch

    from ..decoding.sampling import SamplingConfig, logits_to_probs

    model.reset()
    full = prompt_ids + response
    logits = model.forward(torch.tensor([full], dtype=torch.long))[0, len(prompt_ids) - 1:len(full) - 1]
    probs = logits_to_probs(logits, SamplingConfig(1.0), model.name).double().numpy()
    model.reset()
    return probs / probs.sum(-1, keepdims=True)


def _score_responses(target, prompt_ids: list[int], responses: list[list[int]]) -> list[float]:
    """Proxy judge: the target's mean log-likelihood per token of each response given the prompt."""
    import torch

    target.reset()
    first = torch.log_softmax(target.forward(torch.tensor([prompt_ids], dtype=torch.long))[0, -1].double(), -1)
    base = target.cache_length
    scores = []
    for resp in responses:
        if not resp:
            scores.append(float("nan"))
            continue
        logps = [float(first[resp[0]])]
        if len(resp) > 1:
            target.crop(base)
            logits = target.forward(torch.tensor([resp[:-1]], dtype=torch.long))[0].double()
            lp = torch.log_softmax(logits, -1)[torch.arange(len(resp) - 1), torch.tensor(resp[1:])]
            logps += lp.tolist()
        scores.append(float(np.mean(logps)))
    target.reset()
    return scores


def _calibrate(target, draft, prompts_ids, s: Settings, forms, progress=None) -> dict:
    """Exact per-position rejection and bias for each ε and form, at the prefixes of lossless SD samples."""
    from ..decoding import speculative_decode
    from ..theory.tradeoff import minimal_bias, over_acceptance, uno_bias

    eps_all = (0.0,) + tuple(s.table_eps)
    acc = {form: {eps: {"rejection": [], "opt_bias": [], "uno_bias": []} for eps in eps_all} for form in forms}
    positions = 0
    task = progress.add_task("Table 1 calibration (exact ε sweep)", total=len(prompts_ids)) if progress else None
    for i, ids in enumerate(prompts_ids):
        res = speculative_decode(target, draft, [ids], s.tokens, gamma=s.gamma, temperature=1.0,
                                 seed=s.seed * 7 + 100 + i)
        t_laws = _laws_along(target, ids, res.tokens)
        d_laws = _laws_along(draft, ids, res.tokens)
        positions += len(res.tokens)
        for form in forms:
            for eps in eps_all:
                b = over_acceptance(target=t_laws, draft=d_laws, eps=eps, form=form)
                acc[form][eps]["rejection"] += (1.0 - (d_laws * b).sum(-1)).tolist()
                acc[form][eps]["opt_bias"] += minimal_bias(target=t_laws, draft=d_laws, accept=b).tolist()
                acc[form][eps]["uno_bias"] += uno_bias(target=t_laws, draft=d_laws, accept=b).tolist()
        if progress is not None:
            progress.advance(task)
    out = {"prompts": len(prompts_ids), "positions": positions, "forms": {}}
    for form in forms:
        rows = []
        for eps in eps_all:
            r = acc[form][eps]
            rows.append({"eps": eps, "rejection": float(np.mean(r["rejection"])),
                         "acceptance": 1.0 - float(np.mean(r["rejection"])),
                         "opt_bias": float(np.mean(r["opt_bias"])), "uno_bias": float(np.mean(r["uno_bias"]))})
        out["forms"][form] = rows
    sd = out["forms"][forms[0]][0]["rejection"]
    out["sd_rejection"] = sd
    if "additive" in forms:
        smallest = out["forms"]["additive"][1]["rejection"]
        out["additive_share_removed_at_smallest_eps"] = 1.0 - smallest / sd if sd > 0 else float("nan")
        out["additive_saturates"] = bool(sd > 0 and smallest < (1 - SATURATION_SHARE) * sd)
    return out


def run_table1(s: Settings, progress=None, console=None) -> dict:
    """Decoding-OPT vs Decoding-UNO on the real pair; returns a dict with ``status`` ran|skipped."""
    if s.skip_llm:
        return {"status": "skipped", "note": "skipped (--skip-llm)"}
    ok, note = _llm_status()
    if not ok:
        return {"status": "skipped", "note": note}
    import torch

    threads = torch.get_num_threads()
    try:
        return _run_table1(s, progress)
    finally:
        torch.set_num_threads(threads)


def _run_table1(s: Settings, progress=None) -> dict:
    import torch

    from ..assets.prompts import format_prompt, load_prompts
    from ..decoding import speculative_decode
    from ..errors import ModelNotAvailable
    from ..models.loading import load_pair

    t0 = time.perf_counter()
    budget = s.llm_budget if s.llm_budget is not None else float("inf")
    if s.threads:
        torch.set_num_threads(s.threads)
    try:
        target, draft = load_pair(progress=False, draft_int8=True)
    except (ModelNotAvailable, ImportError, OSError) as exc:
        return {"status": "skipped", "note": f"real models could not be loaded ({type(exc).__name__}: {exc})"}
    load_seconds = time.perf_counter() - t0
    _note(f"Table 1: models loaded in {load_seconds:.0f} s (torch threads {torch.get_num_threads()})")
    if s.llm_load_budget is not None and load_seconds > s.llm_load_budget:
        return {"status": "skipped", "note": f"model loading took {load_seconds:.0f} s, over the quick-mode "
                                             f"budget of {s.llm_load_budget:.0f} s"}
    if load_seconds > 0.5 * budget:
        return {"status": "skipped", "note": f"model loading took {load_seconds:.0f} s, half of the Table 1 "
                                             f"time budget of {budget:.0f} s (machine busy?)"}
    tokenizer = target.tokenizer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prompts = load_prompts(s.prompt_set, s.prompts)
    prompt_note = "; ".join(str(w.message) for w in caught) or None
    prompts_ids = [tokenizer(format_prompt(tokenizer, p), add_special_tokens=False).input_ids for p in prompts]
    stops = _stop_ids(tokenizer)

    # 1) which form? exact acceptance along lossless samples
    calib_forms = ("additive", "ratio")
    calib_t0 = time.perf_counter()
    calibration = _calibrate(target, draft, prompts_ids[:max(1, s.calibration_prompts)], s, calib_forms, progress)
    calib_seconds = time.perf_counter() - calib_t0
    _note(f"Table 1: calibration done in {calib_seconds:.0f} s")
    saturates = calibration.get("additive_saturates", False)
    if s.forms == "both":
        forms = ["additive", "ratio"]
    elif s.forms in ("additive", "ratio"):
        forms = [s.forms]
    elif s.quick:
        forms = ["ratio" if saturates else "additive"]
    else:
        forms = ["additive", "ratio"] if saturates else ["additive"]
    form_note = (f"additive ε {'saturates' if saturates else 'does not saturate'}: at ε = {s.table_eps[0]:g} it "
                 f"already removes {100 * calibration.get('additive_share_removed_at_smallest_eps', float('nan')):.0f}% "
                 f"of standard SD's rejections (threshold {100 * SATURATION_SHARE:.0f}%); forms run: {', '.join(forms)}")

    # 2) paired generations: same prompt, same seed, same ε, OPT and UNO. The work is cut into units
    #    (one prompt, one sample index: every form × ε × method), sample 0 of every prompt first, so a
    #    time budget drops whole units and every (form, ε) row keeps the same pairs.
    units = [(i, j) for j in range(s.samples) for i in range(len(prompts))]
    per_unit = len(forms) * len(s.table_eps) * 2
    generations = []
    task = progress.add_task("Table 1 generation (OPT/UNO pairs)", total=len(units) * per_unit) if progress else None
    gen_t0 = time.perf_counter()
    # rough cost guess before the first unit: one calibration sample (generation + 2 forwards) per generation
    unit_guess = per_unit * calib_seconds / max(1, min(len(prompts_ids), s.calibration_prompts))
    done_units, budget_note, score_seconds = [], None, 0.0
    for i, j in units:
        elapsed = time.perf_counter() - t0
        unit_est = (time.perf_counter() - gen_t0) / len(done_units) if done_units else unit_guess
        if elapsed + 1.1 * unit_est > budget:
            budget_note = (f"time budget {budget:.0f} s reached after {elapsed:.0f} s: {len(done_units)} of "
                           f"{len(units)} (prompt, sample) units generated")
            break
        prompt, ids = prompts[i], prompts_ids[i]
        seed = s.seed * 1_000_003 + 1000 * i + j
        for form in forms:
            for eps in s.table_eps:
                for method in ("opt", "uno"):
                    rule = _tracked_rule(method, eps, form)
                    res = speculative_decode(target, draft, [ids], s.tokens, gamma=s.gamma, temperature=1.0,
                                             seed=seed, relaxation=rule)
                    m = res.metrics
                    generations.append({
                        "exact_rejection_sum": rule.exact_rejection, "exact_rejection_var": rule.exact_variance,
                        "accepted_per_step": list(m.accepted_per_step), "drafted_per_step": list(m.drafted_per_step),
                        "form": form, "eps": eps, "method": method, "prompt": prompt.id, "prompt_index": i,
                        "sample": j, "seed": seed, "tokens": res.tokens, "new_tokens": m.new_tokens,
                        "rejections": m.rejections, "verified": m.bias_positions,
                        "expected_bias": m.expected_bias, "target_calls": m.target_calls,
                        "seconds": m.total_time, "lossless": res.lossless, "method_name": res.method,
                    })
                    if progress is not None:
                        progress.advance(task)
        # 3) proxy judge right away (one prompt prefill per unit): target mean log-likelihood per token of
        #    each stop-truncated response
        score_t0 = time.perf_counter()
        mine = [g for g in generations if g["prompt_index"] == i and g["sample"] == j]
        scores = _score_responses(target, ids, [_truncate(g["tokens"], stops) for g in mine])
        for g, sc in zip(mine, scores):
            g["judged_tokens"] = len(_truncate(g["tokens"], stops))
            g["score"] = sc
        score_seconds += time.perf_counter() - score_t0
        done_units.append((i, j))
        _note(f"Table 1: unit {len(done_units)}/{len(units)} (prompt {prompt.id}, sample {j}) done, "
              f"{time.perf_counter() - t0:.0f} s since loading started")
    if not done_units:
        return {"status": "skipped", "note": f"not even one (prompt, sample) unit fits the Table 1 time budget of "
                                             f"{budget:.0f} s (load {load_seconds:.0f} s, calibration "
                                             f"{calib_seconds:.0f} s)", "calibration": calibration,
                "form_note": form_note}
    prompts_used = sorted({i for i, _ in done_units})
    gen_seconds = time.perf_counter() - gen_t0 - score_seconds
    for g in generations:
        g["text"] = tokenizer.decode(g["tokens"], skip_special_tokens=False)

    # 4) rows per (form, ε)
    calib = {form: {r["eps"]: r for r in rows} for form, rows in calibration["forms"].items()}
    rows = []
    for form in forms:
        for eps in s.table_eps:
            opt = [g for g in generations if g["form"] == form and g["eps"] == eps and g["method"] == "opt"]
            uno = {(g["prompt_index"], g["sample"]): g for g in generations
                   if g["form"] == form and g["eps"] == eps and g["method"] == "uno"}
            pairs = [(o, uno[(o["prompt_index"], o["sample"])]) for o in opt]
            wins = losses = ties = 0
            diffs, rate_diffs = [], []
            for o, u in pairs:
                same = _truncate(o["tokens"], stops) == _truncate(u["tokens"], stops)
                d = o["score"] - u["score"]
                if same or abs(d) < 1e-9:
                    ties += 1
                elif d > 0:
                    wins += 1
                else:
                    losses += 1
                diffs.append(0.0 if same else d)
                rate_diffs.append(o["rejections"] / max(o["verified"], 1) - u["rejections"] / max(u["verified"], 1))
            n = len(pairs)
            win_rate = (wins + 0.5 * ties) / n if n else float("nan")
            lo, hi = wilson_interval(wins + 0.5 * ties, n)
            decisive = wins + losses
            row = {"form": form, "eps": eps, "pairs": n, "wins": wins, "losses": losses, "ties": ties,
                   "win_rate": win_rate, "win_rate_ci95": [lo, hi],
                   "win_rate_decisive": wins / decisive if decisive else float("nan"),
                   "win_rate_decisive_ci95": list(wilson_interval(wins, decisive)) if decisive else [None, None],
                   "loglik_diff_mean_se": _mean_se(diffs),
                   "rejection_rate_diff_mean_se": _mean_se(rate_diffs),
                   "theory": {"rejection": calib[form][eps]["rejection"], "opt_bias": calib[form][eps]["opt_bias"],
                              "uno_bias": calib[form][eps]["uno_bias"], "sd_rejection": calib[form][0.0]["rejection"]}}
            for name, group in (("opt", [p[0] for p in pairs]), ("uno", [p[1] for p in pairs])):
                rate, rate_se = _ratio_se([g["rejections"] for g in group], [g["verified"] for g in group])
                bias_tok = [g["expected_bias"] / max(g["new_tokens"], 1) for g in group]
                bias_pos = [g["expected_bias"] / max(g["verified"], 1) for g in group]
                n_rej = float(np.sum([g["rejections"] for g in group]))
                exact = float(np.sum([g["exact_rejection_sum"] for g in group]))
                var = float(np.sum([g["exact_rejection_var"] for g in group]))
                verified = float(np.sum([g["verified"] for g in group]))
                row[name] = {"rejection_rate": rate, "rejection_rate_se": rate_se,
                             "exact_rejection_rate_visited": exact / verified if verified else float("nan"),
                             "rejections": n_rej, "expected_rejections_visited": exact,
                             "z_vs_exact": (n_rej - exact) / math.sqrt(var) if var > 0 else float("nan"),
                             "acceptance_rate": 1 - rate,
                             "bias_per_token_mean_se": _mean_se(bias_tok),
                             "bias_per_verified_position_mean_se": _mean_se(bias_pos),
                             "score_mean_se": _mean_se([g["score"] for g in group]),
                             "tokens_per_target_call": float(np.sum([g["new_tokens"] for g in group])
                                                             / max(1, np.sum([g["target_calls"] for g in group])))}
            rows.append(row)
    return {"status": "ran", "note": None, "form_note": form_note, "forms": forms,
            "target": target.name, "draft": draft.name, "draft_backend": getattr(draft, "linear_backend", "?"),
            "target_backend": getattr(target, "linear_backend", "?"),
            "prompt_set": s.prompt_set, "prompt_ids": [prompts[i].id for i in prompts_used],
            "prompt_note": prompt_note, "units_planned": len(units), "units_done": len(done_units),
            "budget_seconds": budget, "budget_note": budget_note,
            "samples_per_prompt": s.samples, "tokens": s.tokens, "gamma": s.gamma, "temperature": 1.0,
            "eps": list(s.table_eps), "judge": "PROXY: target model's mean log-likelihood per token of the "
            "response given the prompt (responses truncated after the first stop token); the paper used "
            "RM-Mistral-7B and GPT-4",
            "seconds": {"load": load_seconds, "calibration": calib_seconds, "generation": gen_seconds,
                        "scoring": score_seconds},
            "torch_threads": torch.get_num_threads(),
            "calibration": calibration, "rows": rows, "generations": generations}


# =============================================================================================== report
def _fmt(x, digits=4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if abs(x) < 0.5 * 10 ** -digits:
        x = 0.0                                  # no "-0.0000"
    return f"{x:.{digits}f}"


def _pm(mean, se, digits=4):
    return f"{_fmt(mean, digits)} ± {_fmt(se, digits)}"


def _summary_markdown(results: dict) -> str:
    f2, f3, f4, t1 = results["fig2"], results["fig3"], results["fig4"], results["table1"]
    cfg = results["config"]
    T = f2["chain"]["horizon"]
    L = []
    L.append("# Yin et al. 2024 — Fig. 2–4 and Table 1, reproduced in kind\n")
    L.append(f"Command: `{results['command']}`  ")
    L.append(f"Mode: {'quick (smoke test)' if cfg['quick'] else 'full'}; seed {cfg['seed']}; "
             f"total runtime {results['runtime_seconds']['total']:.1f} s; {results['machine']['platform']}\n")
    L.append("Roles: the paper's p is the **draft**, q the **target**. All exact values come from "
             "`specbound.theory`; Monte Carlo (MC) uses the vectorised NumPy simulator "
             "`simulate_batch_rejections`, and *engine* is the real decoding loop "
             "(`speculative_decode` on `ChainModel`s, drafting to the horizon).\n")

    # ---------------- Fig. 2
    ch = f2["chain"]
    L.append("## Fig. 2 — rejections on a random non-stationary chain\n")
    L.append(f"Chain: {ch['states']} states, T = {T}, target rows Dirichlet({ch['concentration']}) "
             f"(seed {ch['target_seed']}), draft = target mixed with random rows, weight {ch['draft_noise']} "
             f"(seed {ch['draft_seed']}).\n")
    sd = f2["rows"]["sd"]
    L.append(f"**Paper vs here.** The paper reports E[N_rej] = {PAPER['fig2a_expected_rejections']} and speed-up "
             f"50/16.41 ≈ {PAPER['fig2a_speedup']} on its own 7-state chain with T = 50. That chain is not published, "
             f"so only the behaviour is compared (MC converging to the exact value, batch gains saturating). Here: "
             f"exact E[N_rej] = **{sd['exact']:.4f}**, speed-up T/E[N_rej] = **{T / sd['exact']:.3f}**.\n")
    L.append("| setting | formula | exact E[N_rej] | speed-up | NumPy MC (runs) | z | engine MC (runs) | z |")
    L.append("|---|---|---|---|---|---|---|---|")
    for key, r in f2["rows"].items():
        name = "SD (Alg. 1)" if key == "sd" else f"batch SD M={r['drafts']}, design {r['design']}"
        mcs = r["numpy_mc"]
        eng = r.get("engine")
        eng_txt = f"{_pm(eng['mean'], eng['se'], 3)} ({eng['runs']})" if eng else "–"
        eng_z = _fmt(eng["z"], 2) if eng else "–"
        L.append(f"| {name} | {r['formula']} | {r['exact']:.4f} | {r['speedup']:.3f} | "
                 f"{_pm(mcs['mean'], mcs['se'], 3)} ({mcs['runs']}) | {_fmt(r['numpy_z'], 2)} | {eng_txt} | {eng_z} |")
    L.append("")
    L.append("z = (MC mean − exact) / SE; |z| ≤ 4 is the project's pass criterion.\n")
    c = f2["curve"]
    L.append("### Fig. 2c — E[N_rej] against M\n")
    L.append("Design B (branch at each round's first token) is the reconstruction of Thm 3 / Prop. 1; design A "
             "(prefix-tree DFS) is a derived variant, not the paper's statement: its rejections keep falling "
             "toward 0 as M grows (full support), which contradicts Prop. 1.\n")
    L.append("| M | design B exact (Thm 3) | design A exact (derived variant) | speed-up (B) |")
    L.append("|---|---|---|---|")
    for m, b, a in zip(c["drafts"], c["exact_B"], c["exact_A"]):
        L.append(f"| {m} | {b:.4f} | {a:.4f} | {T / b:.3f} |")
    L.append(f"| ∞ (Prop 1, B) | {c['limit_B']:.4f} | – | {c['limit_speedup']:.3f} |")
    L.append("")
    L.append(f"Design B non-increasing in M: {c['nonincreasing_B']}; design A non-increasing: {c['nonincreasing_A']}; "
             f"A ≤ B everywhere: {c['A_le_B']}. Going from M = 1 to M = {c['drafts'][-1]} removes "
             f"{c['exact_B'][0] - c['exact_B'][-1]:.3f} rejections under B; the limit stays at {c['limit_B']:.3f} > 0 "
             "(only each round's first token benefits from more drafts).\n")
    L.append("| MC point | runs | MC mean ± SE | exact | z |")
    L.append("|---|---|---|---|---|")
    for p in c["mc_points"]:
        L.append(f"| M={p['drafts']}, design {p['design']} | {p['runs']} | {_pm(p['mean'], p['se'], 3)} | "
                 f"{p['exact']:.4f} | {_fmt(p['z'], 2)} |")
    L.append("")

    # ---------------- Fig. 3
    L.append("## Fig. 3 — batch improvement against M (one round start)\n")
    L.append("Improvement TV − ρ_M from the closed forms (`bernoulli_batch_improvement`, `uniform_batch_improvement`) "
             "and from the recursive residual chain (`residual_chain`). Max |closed − recursive| over all settings "
             f"and M = 1..{f3['drafts'][-1]}: **{f3['max_abs_diff']:.2e}**.\n")
    L.append("| pair | TV | M=2 | M=4 | M=8 | M=20 | max abs diff |")
    L.append("|---|---|---|---|---|---|---|")
    drafts = f3["drafts"]
    for kind in ("bernoulli", "uniform"):
        for r in f3[kind]:
            vals = [r["closed"][drafts.index(m)] if m in drafts else float("nan") for m in (2, 4, 8, 20)]
            L.append(f"| {kind} {r['label']} | {r['tv']:.3f} | " + " | ".join(_fmt(v) for v in vals)
                     + f" | {r['max_abs_diff']:.1e} |")
    L.append("")

    # ---------------- Fig. 4
    L.append("## Fig. 4 — rejection/bias Pareto front (Thm 4, Thm 5)\n")
    L.append(f"Random instance: V = {f4['vocab']}, draft and target ~ Dirichlet(1); TV(draft, target) = "
             f"**{f4['tv']:.4f}**. Standard SD is (rejection, bias) = (TV, 0), accept-all is (0, TV).\n")
    for form, d in f4["forms"].items():
        rule = "b = min(1, (target + ε)/draft)" if form == "additive" else "b = min(1, target/draft + ε)"
        L.append(f"**{form} form** ({rule}): max |rej + bias − TV| = {d['identity_max_abs_error']:.1e}; "
                 f"max |LP − closed-form Loss*| = {d['lp_max_abs_error']:.1e}; smallest UNO − OPT bias where "
                 f"rejection > 0: {_fmt(d['uno_min_excess_where_rejecting'], 5)}.\n")
        L.append("| ε | rejection | OPT bias | rej + OPT bias | UNO bias | core MC rejection OPT / UNO | "
                 "core MC empirical TV OPT / UNO |")
        L.append("|---|---|---|---|---|---|---|")
        for i, eps in enumerate(f4["eps"]):
            core = d["core_mc"][i]
            L.append(f"| {eps:g} | {_fmt(d['rejection'][i])} | {_fmt(d['opt_bias'][i])} | "
                     f"{_fmt(d['rejection'][i] + d['opt_bias'][i])} | {_fmt(d['uno_bias'][i])} | "
                     f"{_fmt(core['opt']['rejection'])} / {_fmt(core['uno']['rejection'])} (±{_fmt(core['opt']['rejection_se'])}) | "
                     f"{core['opt']['empirical_bias']:.4f} / {core['uno']['empirical_bias']:.4f} |")
        L.append("")
    rows_mc = f4["forms"]["additive"]["core_mc"][0]["opt"]["rows"]
    L.append(f"*Core MC*: {rows_mc} one-step draws through `verify_chain` with the `DecodingOPT` / `DecodingUNO` "
             "rules (the engine's verification core); empirical TV of the emitted-token histogram to the target "
             f"(sampling noise alone gives E[TV] ≲ √(V/(2πN)) ≈ {math.sqrt(f4['vocab'] / (2 * math.pi * rows_mc)):.3f}).\n")

    # ---------------- Table 1
    L.append("## Table 1 in kind — Decoding-OPT vs Decoding-UNO on a real model pair\n")
    if t1["status"] != "ran":
        L.append(f"**Skipped:** {t1['note']}\n")
    else:
        L.append(f"Target `{t1['target']}` ({t1['target_backend']}), draft `{t1['draft']}` ({t1['draft_backend']}); "
                 f"prompts: {len(t1['prompt_ids'])} from `{t1['prompt_set']}` (chat template), "
                 f"{t1['samples_per_prompt']} paired sample(s) per prompt and ε, {t1['tokens']} new tokens, "
                 f"temperature 1, draft length γ = {t1['gamma']}. OPT and UNO share the prompt, the seed and ε, so "
                 "they make identical decisions until their first rejection (common random numbers).\n")
        if t1.get("prompt_note"):
            L.append(f"Prompt note: {t1['prompt_note']}\n")
        if t1.get("budget_note"):
            L.append(f"**Time budget:** {t1['budget_note']} (sample 0 of every prompt first; whole units dropped).\n")
        L.append(f"**Judge = {t1['judge']}.** The paper's Table 1 used pythia-70m/2.8b on Alpaca-Farm-Eval "
                 "(200 prompts × 500 comparisons) and reported OPT > 50 % in all settings; its exact numbers are "
                 "not available, so only the direction can be compared.\n")
        L.append(f"**Form choice.** {t1['form_note']}.\n")
        cal = t1["calibration"]
        L.append(f"**Calibration (used to choose the form).** Exact per-position rejection probability 1 − Σ draft·b and "
                 f"one-step OPT / UNO bias, averaged over the {cal['positions']} positions of {cal['prompts']} lossless "
                 "SD sample(s) of the first prompt(s) (target-law prefixes; acceptance = 1 − rejection); ε = 0 is "
                 "standard SD (= mean TV(draft, target)). The relaxed samples below visit other prefixes, so their "
                 "rates are compared with the exact value at their own prefixes instead:\n")
        L.append("| ε | additive: rejection | additive: OPT / UNO bias | ratio: rejection | ratio: OPT / UNO bias |")
        L.append("|---|---|---|---|---|")
        for ra, rr in zip(cal["forms"]["additive"], cal["forms"]["ratio"]):
            L.append(f"| {ra['eps']:g} | {_fmt(ra['rejection'])} | {_fmt(ra['opt_bias'])} / {_fmt(ra['uno_bias'])} | "
                     f"{_fmt(rr['rejection'])} | {_fmt(rr['opt_bias'])} / {_fmt(rr['uno_bias'])} |")
        L.append("")
        L.append("| form | ε | pairs | rejection OPT | rejection UNO | paired diff OPT−UNO | exact at visited prefixes "
                 "OPT / UNO (z) | bias/token OPT | bias/token UNO | W/L/T | win rate OPT (95% Wilson) | "
                 "decisive win rate | Δ loglik OPT−UNO |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in t1["rows"]:
            o, u = r["opt"], r["uno"]
            lo, hi = r["win_rate_ci95"]
            dlo, dhi = r["win_rate_decisive_ci95"]
            dec = (f"{_fmt(r['win_rate_decisive'], 2)} [{_fmt(dlo, 2)}, {_fmt(dhi, 2)}]"
                   if r["wins"] + r["losses"] else "–")
            L.append(f"| {r['form']} | {r['eps']:g} | {r['pairs']} | {_pm(o['rejection_rate'], o['rejection_rate_se'], 3)} | "
                     f"{_pm(u['rejection_rate'], u['rejection_rate_se'], 3)} | "
                     f"{_pm(*r['rejection_rate_diff_mean_se'], 3)} | "
                     f"{_fmt(o['exact_rejection_rate_visited'], 3)} / {_fmt(u['exact_rejection_rate_visited'], 3)} "
                     f"({_fmt(o['z_vs_exact'], 1)}, {_fmt(u['z_vs_exact'], 1)}) | "
                     f"{_pm(*o['bias_per_token_mean_se'], 4)} | {_pm(*u['bias_per_token_mean_se'], 4)} | "
                     f"{r['wins']}/{r['losses']}/{r['ties']} | {r['win_rate']:.2f} [{lo:.2f}, {hi:.2f}] | {dec} | "
                     f"{_pm(*r['loglik_diff_mean_se'], 3)} |")
        L.append("")
        L.append("Rejection rate = rejected / verified drafted positions (pooled, SE by generation). *Exact at visited "
                 "prefixes* = Σ over the verified positions of the exact rejection probability 1 − Σ draft·b given "
                 "the prefix, computed inside the engine from the laws it verified with (a martingale compensator, "
                 "so measured and exact agree in expectation); z = (rejections − exact) / √Σ P(1−P). bias/token = "
                 "`metrics.expected_bias` / new tokens (sum of exact one-step TV biases at verified positions); win "
                 "rate counts ties (identical responses or equal scores) as ½; the decisive win rate drops ties. "
                 f"Seconds: load {t1['seconds']['load']:.0f}, generation {t1['seconds']['generation']:.0f}, "
                 f"scoring {t1['seconds']['scoring']:.0f} (torch threads {t1['torch_threads']}).\n")
    L.append("## Files\n")
    L.append(", ".join(f"`{name}`" for name in results["files"]) + "\n")
    return "\n".join(L)


def _write_figures(out_dir: Path, f2: dict, raw2: dict, f3: dict, f4: dict) -> list[str]:
    from . import plots

    T = f2["chain"]["horizon"]
    rows = f2["rows"]

    def eng(key):
        e = rows[key].get("engine")
        return (e["runs"], e["mean"], e["se"]) if e else None

    sd = rows["sd"]
    plots.yin_fig2_running(
        out_dir / "fig2a.png",
        f"Fig. 2a: SD on a random {f2['chain']['states']}-state non-stationary chain, T = {T}",
        [{"label": "SD", "samples": raw2["sd"], "exact": sd["exact"],
          "exact_label": f"Thm 1 exact E[N_rej] = {sd['exact']:.3f} (speed-up {T / sd['exact']:.2f})",
          "engine": eng("sd")}], T)
    series = []
    for m in (4, 5):
        b, a = rows[f"M{m}B"], rows[f"M{m}A"]
        series.append({"label": f"batch SD M={m} (B)", "samples": raw2[f"M{m}B"], "exact": b["exact"],
                       "exact_label": f"Thm 3 design B exact, M={m}: {b['exact']:.3f}",
                       "extra_exact": [(a["exact"], f"design A (derived variant) exact, M={m}: {a['exact']:.3f}")],
                       "engine": eng(f"M{m}B")})
    plots.yin_fig2_running(out_dir / "fig2b.png", f"Fig. 2b: batch SD, M = 4 and 5, same chain (T = {T})", series, T)
    c = f2["curve"]
    plots.yin_fig2_scaling(out_dir / "fig2c.png", f"Fig. 2c: batch SD E[N_rej] against M (T = {T})",
                           c["drafts"], c["exact_B"], c["exact_A"], c["limit_B"], sd["exact"], c["mc_points"], T)
    plots.yin_fig3(out_dir / "fig3.png",
                   [{"label": r["label"], "drafts": f3["drafts"], "closed": r["closed"], "recursive": r["recursive"]}
                    for r in f3["bernoulli"]],
                   [{"label": r["label"], "drafts": f3["drafts"], "closed": r["closed"], "recursive": r["recursive"]}
                    for r in f3["uniform"]])
    plots.yin_fig4(out_dir / "fig4.png", f4["tv"],
                   {form: {k: d[k] for k in ("rejection", "opt_bias", "uno_bias")} for form, d in f4["forms"].items()},
                   f4["dense"], f4["eps"],
                   title=f"Fig. 4: over-acceptance on a random V = {f4['vocab']} instance "
                         f"(TV = {f4['tv']:.4f}); OPT on the line, UNO above it")
    return ["fig2a.png", "fig2b.png", "fig2c.png", "fig3.png", "fig4.png"]


def run(args) -> int:
    """Entry point of ``specbound reproduce yin``."""
    import sys

    from rich.console import Console

    s = Settings.from_args(args)
    out_dir = Path(s.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    start = time.perf_counter()
    runtime = {}
    with _progress(console) as progress:
        t = time.perf_counter()
        f2, raw2 = run_fig2(s, progress)
        runtime["fig2"] = time.perf_counter() - t
        _note(f"Fig. 2 done in {runtime['fig2']:.0f} s")
        t = time.perf_counter()
        f3 = run_fig3(s)
        runtime["fig3"] = time.perf_counter() - t
        t = time.perf_counter()
        f4 = run_fig4(s, progress)
        runtime["fig4"] = time.perf_counter() - t
        t = time.perf_counter()
        if s.quick and getattr(args, "llm_minutes", None) is None:
            s.llm_budget = max(0.0, QUICK_TOTAL_SECONDS - (t - start) - 5.0)   # 5 s for figures + report
        t1 = run_table1(s, progress, console)
        runtime["table1"] = time.perf_counter() - t
    t = time.perf_counter()
    files = _write_figures(out_dir, f2, raw2, f3, f4)
    runtime["figures"] = time.perf_counter() - t
    runtime["total"] = time.perf_counter() - start
    import torch

    results = {
        "paper": "Yin, Chen, Huang, Wang 2024, A Theoretical Perspective for Speculative Decoding Algorithm",
        "command": "specbound reproduce yin " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["reproduce", "yin"]
        else "specbound reproduce yin",
        "config": {k: v for k, v in asdict(s).items() if k != "notes"},
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "fig2": f2, "fig3": f3, "fig4": f4, "table1": t1, "runtime_seconds": runtime,
        "files": files + ["summary.md", "results.json"],
    }
    results = _to_jsonable(results)
    (out_dir / "summary.md").write_text(_summary_markdown(results))
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    sd = f2["rows"]["sd"]
    console.print(f"[bold]Fig. 2[/bold]: exact E[N_rej] = {sd['exact']:.4f} (speed-up {s.horizon / sd['exact']:.3f}); "
                  f"NumPy MC {sd['numpy_mc']['mean']:.3f} ± {sd['numpy_mc']['se']:.3f}; paper 16.41 / 3.05 (own chain)")
    console.print(f"[bold]Fig. 4[/bold]: TV = {f4['tv']:.4f}; max |rej + bias − TV| = "
                  f"{max(d['identity_max_abs_error'] for d in f4['forms'].values()):.1e}")
    console.print(f"[bold]Table 1[/bold]: {t1['status']}" + (f" — {t1['note']}" if t1.get("note") else ""))
    console.print(f"Wrote {out_dir}/summary.md, results.json and {len(files)} figures in {runtime['total']:.1f} s")
    return 0
