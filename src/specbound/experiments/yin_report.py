"""`specbound reproduce yin`, the report: summary.md, results.json and fig2a–fig4 PNGs of a
:class:`~.yin_study.YinResult` (rendering only: :func:`.yin_study.run` measures)."""
from __future__ import annotations

import math
from pathlib import Path

from .report import fmt, md_table, pm, write_json, write_text
from .yin import PAPER, Fig2, Fig3
from .yin_pareto import Fig4
from .yin_study import YinResult
from .yin_table1 import Table1

__all__ = ["FIGURES", "summary_markdown", "write_figures", "write_results"]

FIGURES = ["fig2a.png", "fig2b.png", "fig2c.png", "fig3.png", "fig4.png"]


def _fig2_section(f2: Fig2) -> list[str]:
    ch, T, sd = f2.chain, f2.chain.horizon, f2.rows["sd"]
    L = ["## Fig. 2 — rejections on a random non-stationary chain\n",
         f"Chain: {ch.states} states, T = {T}, target rows Dirichlet({ch.concentration}) (seed {ch.target_seed}), "
         f"draft = target mixed with random rows, weight {ch.draft_noise} (seed {ch.draft_seed}).\n",
         f"**Paper vs here.** The paper reports E[N_rej] = {PAPER['fig2a_expected_rejections']} and speed-up "
         f"50/16.41 ≈ {PAPER['fig2a_speedup']} on its own 7-state chain with T = 50. That chain is not published, "
         "so only the behaviour is compared (MC converging to the exact value, batch gains saturating). Here: "
         f"exact E[N_rej] = **{sd.exact:.4f}**, speed-up T/E[N_rej] = **{T / sd.exact:.3f}**.\n"]
    rows = []
    for key, r in f2.rows.items():
        name = "SD (Alg. 1)" if key == "sd" else f"batch SD M={r.drafts}, design {r.design}"
        e = r.engine
        rows.append([name, r.formula, f"{r.exact:.4f}", f"{r.speedup:.3f}",
                     f"{pm(r.numpy_mc.mean, r.numpy_mc.se)} ({r.numpy_mc.runs})", fmt(r.numpy_z, 2),
                     f"{pm(e.mean, e.se)} ({e.runs})" if e else "–", fmt(e.z, 2) if e else "–"])
    L += [md_table(["setting", "formula", "exact E[N_rej]", "speed-up", "NumPy MC (runs)", "z", "engine MC (runs)", "z"],
                   rows), "", "z = (MC mean − exact) / SE; |z| ≤ 4 is the project's pass criterion.\n"]
    c = f2.curve
    L += ["### Fig. 2c — E[N_rej] against M\n",
          "Design B (branch at each round's first token) is the reconstruction of Thm 3 / Prop. 1; design A "
          "(prefix-tree DFS) is a derived variant, not the paper's statement: its rejections keep falling toward 0 "
          "as M grows (full support), which contradicts Prop. 1.\n",
          md_table(["M", "design B exact (Thm 3)", "design A exact (derived variant)", "speed-up (B)"],
                   [[str(m), f"{b:.4f}", f"{a:.4f}", f"{T / b:.3f}"] for m, b, a in zip(c.drafts, c.exact_B, c.exact_A)]
                   + [["∞ (Prop 1, B)", f"{c.limit_B:.4f}", "–", f"{c.limit_speedup:.3f}"]]), "",
          f"Design B non-increasing in M: {c.nonincreasing_B}; design A non-increasing: {c.nonincreasing_A}; A ≤ B "
          f"everywhere: {c.A_le_B}. Going from M = 1 to M = {c.drafts[-1]} removes {c.exact_B[0] - c.exact_B[-1]:.3f} "
          f"rejections under B; the limit stays at {c.limit_B:.3f} > 0 (only each round's first token benefits from "
          "more drafts).\n",
          md_table(["MC point", "runs", "MC mean ± SE", "exact", "z"],
                   [[f"M={p.drafts}, design {p.design}", str(p.runs), pm(p.mean, p.se), f"{p.exact:.4f}", fmt(p.z, 2)]
                    for p in c.mc_points]), ""]
    return L


def _fig3_fig4_sections(f3: Fig3, f4: Fig4) -> list[str]:
    L = ["## Fig. 3 — batch improvement against M (one round start)\n",
         "Improvement TV − ρ_M from the closed forms (`bernoulli_batch_improvement`, `uniform_batch_improvement`) "
         "and from the recursive residual chain (`residual_chain`). Max |closed − recursive| over all settings and "
         f"M = 1..{f3.drafts[-1]}: **{f3.max_abs_diff:.2e}**.\n"]
    rows = []
    for kind, pairs in (("bernoulli", f3.bernoulli), ("uniform", f3.uniform)):
        for r in pairs:
            vals = [r.closed[f3.drafts.index(m)] if m in f3.drafts else float("nan") for m in (2, 4, 8, 20)]
            rows.append([f"{kind} {r.label}", f"{r.tv:.3f}"] + [fmt(v, 4) for v in vals] + [f"{r.max_abs_diff:.1e}"])
    L += [md_table(["pair", "TV", "M=2", "M=4", "M=8", "M=20", "max abs diff"], rows), "",
          "## Fig. 4 — rejection/bias Pareto front (Thm 4, Thm 5)\n",
          f"Random instance: V = {f4.vocab}, draft and target ~ Dirichlet(1); TV(draft, target) = **{f4.tv:.4f}**. "
          "Standard SD is (rejection, bias) = (TV, 0), accept-all is (0, TV).\n"]
    for form, d in f4.forms.items():
        rule = "b = min(1, (target + ε)/draft)" if form == "additive" else "b = min(1, target/draft + ε)"
        L.append(f"**{form} form** ({rule}): max |rej + bias − TV| = {d.identity_max_abs_error:.1e}; max |LP − "
                 f"closed-form Loss*| = {d.lp_max_abs_error:.1e}; smallest UNO − OPT bias where rejection > 0: "
                 f"{fmt(d.uno_min_excess_where_rejecting, 5)}.\n")
        rows = []
        for i, eps in enumerate(f4.eps):
            core = d.core_mc[i]
            rows.append([f"{eps:g}", fmt(d.rejection[i], 4), fmt(d.opt_bias[i], 4),
                         fmt(d.rejection[i] + d.opt_bias[i], 4), fmt(d.uno_bias[i], 4),
                         f"{fmt(core['opt'].rejection, 4)} / {fmt(core['uno'].rejection, 4)} "
                         f"(±{fmt(core['opt'].rejection_se, 4)})",
                         f"{core['opt'].empirical_bias:.4f} / {core['uno'].empirical_bias:.4f}"])
        L += [md_table(["ε", "rejection", "OPT bias", "rej + OPT bias", "UNO bias", "core MC rejection OPT / UNO",
                        "core MC empirical TV OPT / UNO"], rows), ""]
    rows_mc = f4.forms["additive"].core_mc[0]["opt"].rows
    L.append(f"*Core MC*: {rows_mc} one-step draws with the verification core's `DecodingOPT` / `DecodingUNO` rules "
             "(their acceptance b and resampling law, the one-position step of `verify`, vectorised over draws); "
             "empirical TV of the emitted-token histogram to the target (sampling noise alone gives E[TV] ≲ "
             f"√(V/(2πN)) ≈ {math.sqrt(f4.vocab / (2 * math.pi * rows_mc)):.3f}).\n")
    return L


def _table1_section(t1: Table1) -> list[str]:
    L = ["## Table 1 in kind — Decoding-OPT vs Decoding-UNO on a real model pair\n"]
    if t1.status != "ran":
        return L + [f"**Skipped:** {t1.note}\n"]
    L.append(f"Target `{t1.target}` ({t1.target_backend}), draft `{t1.draft}` ({t1.draft_backend}); prompts: "
             f"{len(t1.prompt_ids)} from `{t1.prompt_set}` ({t1.prompt_ids[0]} … {t1.prompt_ids[-1]}; chat template), "
             f"{t1.samples_per_prompt} paired sample(s) "
             f"per prompt and ε, {t1.tokens} new tokens, temperature 1, draft length γ = {t1.gamma}. OPT and UNO share "
             "the prompt, the seed and ε, so they make identical decisions until their first rejection (common random "
             "numbers).\n")
    if t1.prompt_note:
        L.append(f"Prompt note: {t1.prompt_note}\n")
    if t1.budget_note:
        L.append(f"**Time budget:** {t1.budget_note} (sample 0 of every prompt first; whole units dropped).\n")
    L += [f"**Judge = {t1.judge}.** The paper's Table 1 used pythia-70m/2.8b on Alpaca-Farm-Eval (200 prompts × 500 "
          "comparisons) and reported OPT > 50 % in all settings; its exact numbers are not available, so only the "
          "direction can be compared.\n", f"**Form choice.** {t1.form_note}.\n"]
    cal = t1.calibration
    L.append(f"**Calibration (used to choose the form).** Exact per-position rejection probability 1 − Σ draft·b and "
             f"one-step OPT / UNO bias, averaged over the {cal.positions} positions of {cal.prompts} lossless SD "
             "sample(s) of the first prompt(s) (target-law prefixes; acceptance = 1 − rejection); ε = 0 is standard SD "
             "(= mean TV(draft, target)). The relaxed samples below visit other prefixes, so their rates are compared "
             "with the exact value at their own prefixes instead:\n")
    L += [md_table(["ε", "additive: rejection", "additive: OPT / UNO bias", "ratio: rejection", "ratio: OPT / UNO bias"],
                   [[f"{ra.eps:g}", fmt(ra.rejection, 4), f"{fmt(ra.opt_bias, 4)} / {fmt(ra.uno_bias, 4)}",
                     fmt(rr.rejection, 4), f"{fmt(rr.opt_bias, 4)} / {fmt(rr.uno_bias, 4)}"]
                    for ra, rr in zip(cal.forms["additive"], cal.forms["ratio"])]), ""]
    verdicts = []
    for r in t1.rows:
        dlo, dhi = r.win_rate_decisive_ci95
        dec = f"{fmt(r.win_rate_decisive, 2)} [{fmt(dlo, 2)}, {fmt(dhi, 2)}]" if r.wins + r.losses else "–"
        blo, bhi = r.win_rate_bootstrap_ci95
        verdicts.append([r.form, f"{r.eps:g}", f"{r.pairs} ({r.prompts})", f"{r.wins}/{r.losses}/{r.ties}",
                         f"{r.win_rate:.2f} [{r.win_rate_ci95[0]:.2f}, {r.win_rate_ci95[1]:.2f}]",
                         f"[{fmt(blo, 2)}, {fmt(bhi, 2)}]", dec, fmt(r.sign_test_p, 3), f"**{r.verdict}**"])
    decided = sum(r.verdict.startswith(("OPT >", "UNO >")) for r in t1.rows)
    L += ["### Verdicts\n",
          f"The paper's claim: OPT's responses are preferred over UNO's (win rate > 50%) at every ε. Here "
          f"{decided} of {len(t1.rows)} rows are decided at 95%.\n",
          md_table(["form", "ε", "pairs (prompts)", "W/L/T", "win rate OPT (95% Wilson)",
                    "95% bootstrap by prompt", "decisive win rate (Wilson)", "sign test p (decisive)", "verdict"],
                   verdicts), "",
          "Win rate counts ties (identical responses or equal scores) as ½. A row is decided only when both 95% "
          "intervals — Wilson over pairs, and a percentile bootstrap that resamples whole prompts (the samples of one "
          "prompt share it, so they are not independent) — lie on the same side of ½. The sign test uses the decisive "
          "pairs only and treats pairs as independent (it ignores the prompt clustering; shown for reference).\n"]
    rows = []
    for r in t1.rows:
        o, u = r.opt, r.uno
        rows.append([r.form, f"{r.eps:g}", str(r.pairs), pm(o.rejection_rate, o.rejection_rate_se),
                     pm(u.rejection_rate, u.rejection_rate_se), pm(*r.rejection_rate_diff_mean_se),
                     f"{fmt(o.exact_rejection_rate_visited)} / {fmt(u.exact_rejection_rate_visited)} "
                     f"({fmt(o.z_vs_exact, 1)}, {fmt(u.z_vs_exact, 1)})", pm(*o.bias_per_token_mean_se, 4),
                     pm(*u.bias_per_token_mean_se, 4), pm(*r.loglik_diff_mean_se)])
    L += ["### Rates and bias\n",
          md_table(["form", "ε", "pairs", "rejection OPT", "rejection UNO", "paired diff OPT−UNO",
                    "exact at visited prefixes OPT / UNO (z)", "bias/token OPT", "bias/token UNO",
                    "Δ loglik OPT−UNO"], rows), "",
          "Rejection rate = rejected / verified drafted positions (pooled, SE by generation). *Exact at visited "
          "prefixes* = Σ over the verified positions of the exact rejection probability 1 − b(x) of the drafted token "
          "x given its prefix (`RoundRecord.accept_probs`, the laws the engine verified with: a martingale "
          "compensator, so measured and exact agree in expectation); z = (rejections − exact) / √Σ b(1−b). "
          "bias/token = `metrics.expected_bias` / new tokens (sum of exact one-step TV biases at verified "
          f"positions). Seconds: load {t1.seconds.get('load', 0):.0f}, calibration "
          f"{t1.seconds.get('calibration', 0):.0f}, generation and scoring {t1.seconds.get('generation', 0):.0f} "
          f"(torch threads {t1.torch_threads}).\n"]
    return L


def summary_markdown(result: YinResult) -> str:
    cfg = result.config
    L = ["# Yin et al. 2024 — Fig. 2–4 and Table 1, reproduced in kind\n", f"Command: `{result.command}`  ",
         f"Mode: {'quick (smoke test)' if cfg.quick else 'full'}; seed {cfg.seed}; total runtime "
         f"{result.runtime_seconds.get('total', float('nan')):.1f} s; {result.machine.get('platform', '?')}\n",
         "Roles: the paper's p is the **draft**, q the **target**. All exact values come from `specbound.theory`; "
         "Monte Carlo (MC) uses the vectorised NumPy simulator `simulate_batch_rejections`, and *engine* is the real "
         "decoding loop (`speculative_decode` on `ChainModel`s, drafting to the horizon).\n"]
    L += _fig2_section(result.fig2) + _fig3_fig4_sections(result.fig3, result.fig4) + _table1_section(result.table1)
    L += ["## Files\n", ", ".join(f"`{name}`" for name in result.files) + "\n"]
    return "\n".join(L)


def write_figures(out_dir: Path, result: YinResult) -> list[str]:
    """fig2a–fig4 PNGs (Fig. 2a/b draw the raw Monte Carlo samples of ``result.fig2_samples``); returns
    their names."""
    from . import plots

    f2, raw2, f3, f4 = result.fig2, result.fig2_samples, result.fig3, result.fig4
    T, rows = f2.chain.horizon, f2.rows

    def eng(key):
        e = rows[key].engine
        return (e.runs, e.mean, e.se) if e else None

    sd = rows["sd"]
    plots.yin_fig2_running(out_dir / "fig2a.png",
                           f"Fig. 2a: SD on a random {f2.chain.states}-state non-stationary chain, T = {T}",
                           [{"label": "SD", "samples": raw2["sd"], "exact": sd.exact,
                             "exact_label": f"Thm 1 exact E[N_rej] = {sd.exact:.3f} (speed-up {T / sd.exact:.2f})",
                             "engine": eng("sd")}], T)
    series = []
    for m in (4, 5):
        b, a = rows[f"M{m}B"], rows[f"M{m}A"]
        series.append({"label": f"batch SD M={m} (B)", "samples": raw2[f"M{m}B"], "exact": b.exact,
                       "exact_label": f"Thm 3 design B exact, M={m}: {b.exact:.3f}",
                       "extra_exact": [(a.exact, f"design A (derived variant) exact, M={m}: {a.exact:.3f}")],
                       "engine": eng(f"M{m}B")})
    plots.yin_fig2_running(out_dir / "fig2b.png", f"Fig. 2b: batch SD, M = 4 and 5, same chain (T = {T})", series, T)
    c = f2.curve
    plots.yin_fig2_scaling(out_dir / "fig2c.png", f"Fig. 2c: batch SD E[N_rej] against M (T = {T})", c.drafts,
                           c.exact_B, c.exact_A, c.limit_B, sd.exact,
                           [{"drafts": p.drafts, "mean": p.mean, "se": p.se, "design": p.design} for p in c.mc_points], T)
    plots.yin_fig3(out_dir / "fig3.png",
                   [{"label": r.label, "drafts": f3.drafts, "closed": r.closed, "recursive": r.recursive}
                    for r in f3.bernoulli],
                   [{"label": r.label, "drafts": f3.drafts, "closed": r.closed, "recursive": r.recursive}
                    for r in f3.uniform])
    plots.yin_fig4(out_dir / "fig4.png", f4.tv,
                   {form: {"rejection": d.rejection, "opt_bias": d.opt_bias, "uno_bias": d.uno_bias}
                    for form, d in f4.forms.items()},
                   {form: {"eps": d.eps, "rejection": d.rejection, "opt_bias": d.opt_bias, "uno_bias": d.uno_bias}
                    for form, d in f4.dense.items()}, f4.eps,
                   title=f"Fig. 4: over-acceptance on a random V = {f4.vocab} instance (TV = {f4.tv:.4f}); OPT on the "
                         "line, UNO above it")
    return list(FIGURES)


def write_results(result: YinResult, out_dir: Path) -> None:
    """summary.md and results.json (figures are written by :func:`write_figures`)."""
    write_text(Path(out_dir) / "summary.md", summary_markdown(result))
    write_json(result, Path(out_dir) / "results.json")
