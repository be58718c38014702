"""`specbound reproduce yin`, Table 1 in kind: Decoding-OPT against Decoding-UNO on a real pair.

The paper's Table 1 used pythia-70m/2.8b on Alpaca-Farm-Eval and a reward model / GPT-4 as judge.
Here: the packaged Qwen2.5-Coder 1.5B target (int8 by default, ``Settings.target_precision``) with its
int8 0.5B draft on MT-Bench prompts at
ε ∈ {0.1, 0.2, 0.4, 0.8}; OPT and UNO share prompt, seed and ε (common random numbers); rejection
rates, measured bias (``DecodeMetrics.expected_bias``) and a win rate judged by a PROXY available
offline, the target's own mean log-likelihood of the response. Everything is read from the engine's
results: rejections and tested positions from :class:`~specbound.decoding.DecodeMetrics`, the exact
rejection probability 1 − b(x) of every tested drafted token from ``RoundRecord.accept_probs``.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..assets.prompts import format_prompt, load_prompts
from ..decoding import SamplingConfig, speculative_decode
from ..errors import ModelNotAvailable
from ..models import loading as model_loading   # a module: tests and commands swap its loaders
from ..models.tokens import stop_token_ids
from ..theory.tradeoff import minimal_bias, over_acceptance, uno_bias
from ..measure.journal import PartialResults, no_journal
from ..measure.llm import default_pair_status, laws_along, score_responses, torch_threads, truncate_at_stop
from .report import Stage, note
from ..measure.stats import cluster_bootstrap_interval, mean_se, ratio_se, sign_test_p, wilson_interval
from ..seeds import derive_seed
from .yin import Settings

__all__ = ["Calibration", "Generation", "Table1", "Table1Row", "measure_table1", "run_table1", "verdict"]

#: Additive ε "saturates" when its smallest ε already removes more than this share of SD's rejections.
SATURATION_SHARE = 0.75
JUDGE = ("PROXY: target model's mean log-likelihood per token of the response given the prompt (responses "
         "truncated after the first stop token); the paper used RM-Mistral-7B and GPT-4. No reward model and no "
         "model larger than the 1.5B target can be installed offline here (the packaged models are the 1.5B/0.5B "
         "Qwen2.5-Coder pair, SmolLM2-135M and Gemma-3-270M), so no second judge is run")


@dataclass
class CalibrationRow:
    eps: float
    rejection: float
    acceptance: float
    opt_bias: float
    uno_bias: float


@dataclass
class Calibration:
    """Exact per-position rejection and one-step OPT/UNO bias for each ε and form, averaged over the
    positions of lossless SD samples (ε = 0 first: standard SD)."""

    prompts: int
    positions: int
    forms: dict[str, list[CalibrationRow]]
    sd_rejection: float
    additive_share_removed_at_smallest_eps: float | None = None
    additive_saturates: bool | None = None
    seconds: float = 0.0


@dataclass
class Generation:
    """One relaxed generation (form, ε, method) of one (prompt, sample) unit."""

    form: str
    eps: float
    method: str
    prompt: str
    prompt_index: int
    sample: int
    seed: int
    tokens: list[int]
    new_tokens: int
    rejections: int
    verified: int
    expected_bias: float
    target_calls: int
    seconds: float
    lossless: bool
    method_name: str
    accepted_per_step: list[int]
    drafted_per_step: list[int]
    exact_rejection_sum: float
    exact_rejection_var: float
    judged_tokens: int = 0
    score: float = float("nan")
    text: str = ""


@dataclass
class MethodStats:
    rejection_rate: float
    rejection_rate_se: float
    exact_rejection_rate_visited: float
    rejections: float
    expected_rejections_visited: float
    z_vs_exact: float
    acceptance_rate: float
    bias_per_token_mean_se: tuple[float, float]
    bias_per_verified_position_mean_se: tuple[float, float]
    score_mean_se: tuple[float, float]
    tokens_per_target_call: float


@dataclass
class Table1Row:
    form: str
    eps: float
    pairs: int
    wins: int
    losses: int
    ties: int
    win_rate: float
    win_rate_ci95: tuple[float, float]
    win_rate_decisive: float
    win_rate_decisive_ci95: tuple[float | None, float | None]
    loglik_diff_mean_se: tuple[float, float]
    rejection_rate_diff_mean_se: tuple[float, float]
    theory: dict[str, float]
    opt: MethodStats
    uno: MethodStats
    prompts: int = 0
    win_rate_bootstrap_ci95: tuple[float, float] = (float("nan"), float("nan"))
    sign_test_p: float = float("nan")
    verdict: str = ""


@dataclass
class Table1:
    status: str                                  # ran | skipped
    note: str | None = None
    form_note: str | None = None
    calibration: Calibration | None = None
    forms: list[str] = field(default_factory=list)
    target: str = ""
    draft: str = ""
    target_backend: str = ""
    draft_backend: str = ""
    prompt_set: str = ""
    prompt_ids: list[str] = field(default_factory=list)
    prompt_note: str | None = None
    units_planned: int = 0
    units_done: int = 0
    budget_seconds: float = float("nan")
    budget_note: str | None = None
    samples_per_prompt: int = 0
    tokens: int = 0
    gamma: int = 0
    temperature: float = 1.0
    eps: list[float] = field(default_factory=list)
    judge: str = JUDGE
    seconds: dict[str, float] = field(default_factory=dict)
    torch_threads: int = 1
    rows: list[Table1Row] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------
def calibrate(target, draft, prompts_ids, s: Settings, forms, progress=None) -> Calibration:
    """Exact per-position rejection 1 − Σ draft·b and one-step OPT/UNO bias (Yin et al. 2024, Thm 4/5)
    at the prefixes of lossless SD samples of the first prompts, for ε = 0 and every table ε."""
    t0 = time.perf_counter()
    eps_all = (0.0,) + tuple(s.table_eps)
    acc = {form: {eps: {"rejection": [], "opt_bias": [], "uno_bias": []} for eps in eps_all} for form in forms}
    positions = 0
    stage = Stage(progress, "Table 1 calibration (exact ε sweep)", len(prompts_ids))
    sampling = SamplingConfig(1.0)
    for i, ids in enumerate(prompts_ids):
        res = speculative_decode(target, draft, [ids], s.tokens, gamma=s.gamma, temperature=1.0,
                                 seed=derive_seed(s.seed, "yin table1 calibration", i))
        t_laws = laws_along(target, ids, res.tokens, sampling)
        d_laws = laws_along(draft, ids, res.tokens, sampling)
        positions += len(res.tokens)
        for form in forms:
            for eps in eps_all:
                b = over_acceptance(target=t_laws, draft=d_laws, eps=eps, form=form)
                acc[form][eps]["rejection"] += (1.0 - (d_laws * b).sum(-1)).tolist()
                acc[form][eps]["opt_bias"] += minimal_bias(target=t_laws, draft=d_laws, accept=b).tolist()
                acc[form][eps]["uno_bias"] += uno_bias(target=t_laws, draft=d_laws, accept=b).tolist()
        stage.advance()
    rows = {form: [CalibrationRow(eps=eps, rejection=float(np.mean(r["rejection"])),
                                  acceptance=1.0 - float(np.mean(r["rejection"])),
                                  opt_bias=float(np.mean(r["opt_bias"])), uno_bias=float(np.mean(r["uno_bias"])))
                   for eps, r in acc[form].items()] for form in forms}
    sd = rows[forms[0]][0].rejection
    out = Calibration(prompts=len(prompts_ids), positions=positions, forms=rows, sd_rejection=sd)
    if "additive" in forms:
        smallest = rows["additive"][1].rejection
        out.additive_share_removed_at_smallest_eps = 1.0 - smallest / sd if sd > 0 else float("nan")
        out.additive_saturates = bool(sd > 0 and smallest < (1 - SATURATION_SHARE) * sd)
    out.seconds = time.perf_counter() - t0
    return out


def generate_unit(target, draft, prompt_id: str, ids: list[int], i: int, j: int, forms, stops, s: Settings,
                  tokenizer=None) -> list[Generation]:
    """Every (form, ε, method) generation of prompt ``i``, sample ``j``, then the proxy judge. The unit has
    ONE seed, ``derive_seed(s.seed, "yin table1", i, j)``: OPT and UNO (and every form and ε) decode on
    common random numbers, so a pair differs only through its rule."""
    seed = derive_seed(s.seed, "yin table1", i, j)
    out = []
    for form in forms:
        for eps in s.table_eps:
            for method in ("opt", "uno"):
                res = speculative_decode(target, draft, [ids], s.tokens, gamma=s.gamma, temperature=1.0, seed=seed,
                                         relaxation=(method, eps, form))
                m = res.metrics
                probs = [a for r in res.rounds for a in r.accept_probs]    # b(x) of every tested drafted token
                out.append(Generation(
                    form=form, eps=eps, method=method, prompt=prompt_id, prompt_index=i, sample=j, seed=seed,
                    tokens=res.tokens, new_tokens=m.new_tokens, rejections=m.rejections, verified=m.bias_positions,
                    expected_bias=m.expected_bias, target_calls=m.target_calls, seconds=m.total_time,
                    lossless=res.lossless, method_name=res.method, accepted_per_step=list(m.accepted_per_step),
                    drafted_per_step=list(m.drafted_per_step), exact_rejection_sum=float(sum(1.0 - a for a in probs)),
                    exact_rejection_var=float(sum(a * (1.0 - a) for a in probs))))
    judged = [truncate_at_stop(g.tokens, stops) for g in out]
    for g, resp, score in zip(out, judged, score_responses(target, ids, judged)):
        g.judged_tokens, g.score = len(resp), score
        if tokenizer is not None:
            g.text = tokenizer.decode(g.tokens, skip_special_tokens=False)
    return out


def _method_stats(group: list[Generation]) -> MethodStats:
    rate, rate_se = ratio_se([g.rejections for g in group], [g.verified for g in group])
    n_rej = float(np.sum([g.rejections for g in group]))
    exact = float(np.sum([g.exact_rejection_sum for g in group]))
    var = float(np.sum([g.exact_rejection_var for g in group]))
    verified = float(np.sum([g.verified for g in group]))
    return MethodStats(
        rejection_rate=rate, rejection_rate_se=rate_se,
        exact_rejection_rate_visited=exact / verified if verified else float("nan"), rejections=n_rej,
        expected_rejections_visited=exact, z_vs_exact=(n_rej - exact) / math.sqrt(var) if var > 0 else float("nan"),
        acceptance_rate=1 - rate,
        bias_per_token_mean_se=mean_se([g.expected_bias / max(g.new_tokens, 1) for g in group]),
        bias_per_verified_position_mean_se=mean_se([g.expected_bias / max(g.verified, 1) for g in group]),
        score_mean_se=mean_se([g.score for g in group]),
        tokens_per_target_call=float(np.sum([g.new_tokens for g in group])
                                     / max(1, np.sum([g.target_calls for g in group]))))


def verdict(wilson: tuple[float, float], bootstrap: tuple[float, float], pairs: int) -> str:
    """The row's verdict on the paper's claim "OPT is preferred over UNO": decided only when BOTH 95%
    intervals of the win rate (Wilson over pairs; bootstrap over prompts, which keeps the samples of one
    prompt together) lie on the same side of ½."""
    bounds = [b for b in (*wilson, *bootstrap) if b is not None and math.isfinite(b)]
    if len(bounds) == 4 and min(bounds) > 0.5:
        return "OPT > UNO at 95%"
    if len(bounds) == 4 and max(bounds) < 0.5:
        return "UNO > OPT at 95%"
    return f"no difference detectable at n = {pairs}"


def table_rows(generations: list[Generation], forms, table_eps, calibration: Calibration, stops,
               resamples: int = 4000, seed: int = 0) -> list[Table1Row]:
    """Per (form, ε): paired OPT/UNO comparison (win rate with ties as ½; Wilson 95% over pairs, a
    prompt-clustered bootstrap 95%, the exact sign test on the decisive pairs, and a :func:`verdict`),
    rates, bias."""
    calib = {form: {r.eps: r for r in rows} for form, rows in calibration.forms.items()}
    rows = []
    for form in forms:
        for k, eps in enumerate(table_eps):
            opt = [g for g in generations if g.form == form and g.eps == eps and g.method == "opt"]
            uno = {(g.prompt_index, g.sample): g for g in generations if g.form == form and g.eps == eps and g.method == "uno"}
            pairs = [(o, uno[(o.prompt_index, o.sample)]) for o in opt]
            wins = losses = ties = 0
            diffs, rate_diffs, points = [], [], []
            for o, u in pairs:
                same = truncate_at_stop(o.tokens, stops) == truncate_at_stop(u.tokens, stops)
                d = o.score - u.score
                if same or abs(d) < 1e-9:
                    ties, point = ties + 1, 0.5
                elif d > 0:
                    wins, point = wins + 1, 1.0
                else:
                    losses, point = losses + 1, 0.0
                points.append(point)
                diffs.append(0.0 if same else d)
                rate_diffs.append(o.rejections / max(o.verified, 1) - u.rejections / max(u.verified, 1))
            n, decisive = len(pairs), wins + losses
            c = calib[form]
            wilson = wilson_interval(wins + 0.5 * ties, n)
            boot = cluster_bootstrap_interval(points, [o.prompt_index for o, _ in pairs], resamples,
                                              derive_seed(seed, "yin table1 bootstrap", form, k)) if n else (
                float("nan"), float("nan"))
            rows.append(Table1Row(
                form=form, eps=eps, pairs=n, wins=wins, losses=losses, ties=ties,
                win_rate=(wins + 0.5 * ties) / n if n else float("nan"),
                win_rate_ci95=wilson, win_rate_bootstrap_ci95=boot, sign_test_p=sign_test_p(wins, losses),
                verdict=verdict(wilson, boot, n), prompts=len({o.prompt_index for o, _ in pairs}),
                win_rate_decisive=wins / decisive if decisive else float("nan"),
                win_rate_decisive_ci95=wilson_interval(wins, decisive) if decisive else (None, None),
                loglik_diff_mean_se=mean_se(diffs), rejection_rate_diff_mean_se=mean_se(rate_diffs),
                theory={"rejection": c[eps].rejection, "opt_bias": c[eps].opt_bias, "uno_bias": c[eps].uno_bias,
                        "sd_rejection": c[0.0].rejection},
                opt=_method_stats([p[0] for p in pairs]), uno=_method_stats([p[1] for p in pairs])))
    return rows


def _choose_forms(s: Settings, calibration: Calibration) -> tuple[list[str], str]:
    saturates = bool(calibration.additive_saturates)
    if s.forms == "both":
        forms = ["additive", "ratio"]
    elif s.forms in ("additive", "ratio"):
        forms = [s.forms]
    else:       # auto: one form, so every row gets the whole sample; a saturating form's rows would be ties
        forms = ["ratio" if saturates else "additive"]
    share = calibration.additive_share_removed_at_smallest_eps
    return forms, (f"additive ε {'saturates' if saturates else 'does not saturate'}: at ε = {s.table_eps[0]:g} it "
                   f"already removes {100 * (share if share is not None else float('nan')):.0f}% of standard SD's "
                   f"rejections (threshold {100 * SATURATION_SHARE:.0f}%); forms run: {', '.join(forms)}")


def measure_table1(target, draft, prompt_names: list[str], prompts_ids: list[list[int]], stops, s: Settings,
                   progress=None, journal: PartialResults | None = None, started: float | None = None,
                   load_seconds: float = 0.0) -> Table1:
    """Table 1 on loaded models: calibration, then (prompt, sample) units — sample 0 of every prompt
    first, so a time budget (``s.llm_budget`` from ``started``) drops whole units and every (form, ε)
    row keeps the same pairs. Each unit is one journal entry (``--resume``)."""
    journal = journal if journal is not None else no_journal()
    t0 = started if started is not None else time.perf_counter()
    budget = s.llm_budget if s.llm_budget is not None else float("inf")
    calibration = journal.unit("table1/calibration", Calibration, lambda: calibrate(
        target, draft, prompts_ids[:max(1, s.calibration_prompts)], s, ("additive", "ratio"), progress))
    note(f"Table 1: calibration done in {calibration.seconds:.0f} s")
    forms, form_note = _choose_forms(s, calibration)
    units = [(i, j) for j in range(s.samples) for i in range(len(prompts_ids))]
    per_unit = len(forms) * len(s.table_eps) * 2
    stage = Stage(progress, "Table 1 generation (OPT/UNO pairs)", len(units) * per_unit)
    gen_t0 = time.perf_counter()
    unit_guess = per_unit * calibration.seconds / max(1, min(len(prompts_ids), s.calibration_prompts))
    generations, done, budget_note = [], [], None
    tokenizer = getattr(target, "tokenizer", None)
    for i, j in units:
        elapsed = time.perf_counter() - t0
        unit_est = (time.perf_counter() - gen_t0) / len(done) if done else unit_guess
        if f"table1/{i}/{j}" not in journal and elapsed + 1.1 * unit_est > budget:
            budget_note = (f"time budget {budget:.0f} s reached after {elapsed:.0f} s: {len(done)} of {len(units)} "
                           "(prompt, sample) units generated")
            break
        generations += journal.unit(f"table1/{i}/{j}", list[Generation], lambda i=i, j=j: generate_unit(
            target, draft, prompt_names[i], prompts_ids[i], i, j, forms, stops, s, tokenizer))
        done.append((i, j))
        stage.advance(per_unit)
        note(f"Table 1: unit {len(done)}/{len(units)} (prompt {prompt_names[i]}, sample {j}) done, "
             f"{time.perf_counter() - t0:.0f} s since loading started")
    common = dict(form_note=form_note, calibration=calibration, target=target.name, draft=draft.name,
                  target_backend=target.info.kernels, draft_backend=draft.info.kernels, prompt_set=s.prompt_set)
    if not done:
        return Table1("skipped", note=f"not even one (prompt, sample) unit fits the Table 1 time budget of {budget:.0f} s "
                      f"(load {load_seconds:.0f} s, calibration {calibration.seconds:.0f} s)", **common)
    gen_seconds = time.perf_counter() - gen_t0
    return Table1(
        "ran", forms=forms, prompt_ids=[prompt_names[i] for i in sorted({i for i, _ in done})],
        units_planned=len(units), units_done=len(done), budget_seconds=budget, budget_note=budget_note,
        samples_per_prompt=s.samples, tokens=s.tokens, gamma=s.gamma, eps=list(s.table_eps),
        seconds={"load": load_seconds, "calibration": calibration.seconds, "generation": gen_seconds},
        torch_threads=_threads(),
        rows=table_rows(generations, forms, s.table_eps, calibration, stops, s.bootstrap, s.seed),
        generations=generations, **common)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def run_table1(s: Settings, progress=None, journal: PartialResults | None = None) -> Table1:
    """Table 1 on the default pair; ``status`` "skipped" with a note when --skip-llm, the models are
    missing, or loading exceeds the budget."""
    if s.skip_llm:
        return Table1("skipped", note="skipped (--skip-llm)")
    ok, why = default_pair_status(s.target_precision)
    if not ok:
        return Table1("skipped", note=why)
    t0 = time.perf_counter()
    budget = s.llm_budget if s.llm_budget is not None else float("inf")
    with torch_threads(s.threads):
        try:
            target, draft = model_loading.load_pair(progress=False, draft_int8=True,
                                                    target_precision=s.target_precision)
        except (ModelNotAvailable, ImportError, OSError) as exc:
            return Table1("skipped", note=f"real models could not be loaded ({type(exc).__name__}: {exc})")
        load_seconds = time.perf_counter() - t0
        note(f"Table 1: models loaded in {load_seconds:.0f} s (torch threads {_threads()})")
        if s.llm_load_budget is not None and load_seconds > s.llm_load_budget:
            return Table1("skipped", note=f"model loading took {load_seconds:.0f} s, over the quick-mode budget of "
                                          f"{s.llm_load_budget:.0f} s")
        if load_seconds > 0.5 * budget:
            return Table1("skipped", note=f"model loading took {load_seconds:.0f} s, half of the Table 1 time budget "
                                          f"of {budget:.0f} s (machine busy?)")
        tokenizer = target.tokenizer
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prompts = load_prompts(s.prompt_set, s.prompts, offset=s.prompt_offset)
        ids = [tokenizer(format_prompt(tokenizer, p), add_special_tokens=False).input_ids for p in prompts]
        out = measure_table1(target, draft, [p.id for p in prompts], ids, set(stop_token_ids(target)), s, progress,
                             journal, t0, load_seconds)
        out.prompt_note = "; ".join(str(w.message) for w in caught) or None
        return out
