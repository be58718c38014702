"""`specbound reproduce pankratov`, the report: results.json, report.md/.html and the PNGs of a
:class:`~.pankratov.PankratovResult` (and the per-set analyze reports)."""
from __future__ import annotations

import math
from pathlib import Path

from .analyze_report import per_p_table, speedup_table, write_report
from .pankratov import PRECISION_TARGET, Claims, Interval, MomentRow, PankratovResult, SyntheticChecks
from .report import fmt, markdown_to_html, md_table, write_json, write_text

__all__ = ["claims_markdown", "render", "report_markdown", "synthetic_markdown", "table_markdown"]


def _ci(x: Interval, digits: int = 3) -> str:
    return f"{fmt(x.value, digits)} [{fmt(x.lo, digits)}, {fmt(x.hi, digits)}]"


def claims_markdown(c: Claims, seconds: float, sizes: str) -> str:
    """The claims section: what was measured at which size, each claim's interval and verdict."""
    L = ["## Claims and verdicts", "",
         f"Sizes: {sizes}. Time: {seconds / 60:.1f} min for the whole reproduction. **{c.decided} of {c.total}** "
         "real-model claims below are decided at 95% (\"not decided\" means the interval does not separate the "
         "alternatives at this size). Intervals are normal 95% intervals (±1.96 SE); E[X*] SEs count the positions "
         "of one prompt's sampled texts as one unit (they are correlated), μ SEs are across prompts.", "",
         f"**Oracle precision** (target: SE ≤ {PRECISION_TARGET:.0%} of E[X*](P)):", "",
         md_table(["set", "positions (texts, prompts)"] + [f"E[X*]({P}) ± SE (SE/value)" for P in c.oracle_precision[0].P]
                  + ["target met"],
                  [[o.set, f"{o.positions} ({o.samples}, {o.prompts or o.samples})"]
                   + [f"{fmt(v, 3)} ± {fmt(se, 3)} ({r:.1%})" for v, se, r in zip(o.value, o.se_by_sample, o.relative_se)]
                   + ["yes" if o.target_met else "NO"] for o in c.oracle_precision]) if c.oracle_precision else "–", "",
         *_precision_split(c),
         "**Growth of the oracle: slope of E[X*] against ln P vs 1/μ** (§3.3: E[X*] ≈ ln(μP)/μ + μ₂/(2μ²) − 1 for "
         "i.i.d. environments; real text is not i.i.d. and P ≤ 64 is far from asymptotic — the table says how far). "
         "Slope: mean of per-position least-squares slopes over the P listed; slope·μ's interval treats slope and μ "
         "as independent.", "",
         md_table(["set", "P fitted", "slope [95%]", "1/μ [95%]", "slope·μ [95%]", "verdict"],
                  [[s.set, ", ".join(map(str, s.capacities)), _ci(s.slope), _ci(s.inverse_mu), _ci(s.slope_times_mu, 2),
                    s.verdict] for s in c.slopes]), "",
         "**Which prompt set has more headroom** (the paper reads a lower μ as more parallelisation headroom): per "
         "pair of sets, μ and E[X*](P_max) of the target.", "",
         md_table(["sets (a vs b)", "μ a / b", "E[X*] a / b", "verdict"],
                  [[f"{m.a} vs {m.b}", f"{_ci(m.a_value)} / {_ci(m.b_value)}", f"{_ci(x.a_value, 2)} / {_ci(x.b_value, 2)}",
                    m.verdict] for m, x in zip(c.set_order[::2], c.set_order[1::2])]), "",
         "**Which model has lower entropy** (the paper: the larger model has lower and more stable μ and μ₂), each "
         "model on its own samples at T = 1:", "",
         md_table(["claim", "a", "b", "a [95%]", "b [95%]", "a − b [95%]", "verdict"],
                  [[m.claim, m.a, m.b, _ci(m.a_value), _ci(m.b_value), _ci(m.diff), m.verdict]
                   for m in c.model_order]) if c.model_order else "(draft moments not measured)", "",
         "**The rigorous bounds against the oracle** (Thm 1 / Lemma 7 forms; the tightest valid form per P):", "",
         md_table(["set", "verdict", "closest P", "(bound − oracle)/SE there"],
                  [[b.set, b.verdict, str(b.worst_P), fmt(b.worst_margin_se, 1)] for b in c.bounds]), ""]
    return "\n".join(L)


def _precision_split(c: Claims) -> list[str]:
    """Where the oracle's error comes from: the variance between prompts bounds the SE from below."""
    rows = [o for o in c.oracle_precision if o.between_var]
    if not rows:
        return []
    body = [[o.set, str(P), fmt(b, 1), fmt(w, 1), f"{fl:.1%}" if math.isfinite(fl) else "–",
             f"{o.set_prompts}", f"{math.ceil(n)}" if math.isfinite(n) else "–",
             "yes" if math.isfinite(fl) and fl <= PRECISION_TARGET else "NO"]
            for o in rows for P, b, w, fl, n in zip(o.P, o.between_var, o.within_var, o.floor_relative_se,
                                                     o.prompts_for_target)]
    return [f"**Where the error comes from**: the variance of E[X | T*(P)] between prompts (σ_b²) and within "
            "one prompt's positions and texts (σ_w²), by a one-way random-effects split. With n prompts and m "
            "positions each the SE is ≈ √(σ_b²/n + σ_w²/(nm)): no number of texts or positions takes it below "
            f"σ_b/√n, so a set whose floor with all its prompts exceeds {PRECISION_TARGET:.0%} cannot meet the "
            "target at this size; more prompts of the same kind would.", "",
            md_table(["set", "P", "σ_b²", "σ_w²", "SE floor / value (all prompts)", "prompts in the set",
                      f"prompts needed for {PRECISION_TARGET:.0%} (1 position each)", "reachable"], body), ""]


def synthetic_markdown(synth: SyntheticChecks) -> str:
    header = ["case", "μ", "μ₂", "P range", "fitted slope", "1/μ", "slope·μ − 1", f"within {synth.tolerance:.0%}",
              "renewal ≥ E*", "published ≥ E* (P≥3)", "E* at checkpoints"]
    rows = []
    for c in synth.cases:
        slope = fmt(c.slope, 4) + (f" ± {fmt(c.slope_se, 4)}" if c.slope_se else "")
        cp = ", ".join(f"{k}: {v:.3f}" for k, v in c.checkpoints.items())
        rows.append([c.name, fmt(c.mu, 4), fmt(c.mu2, 4), f"{c.p_range[0]}–{c.p_range[1]}", slope,
                     fmt(c.inverse_mu, 4), f"{c.relative_error:+.2%}", "yes" if c.within_tolerance else "NO",
                     "yes" if c.renewal_holds else "NO", "yes" if c.published_holds_P_ge_3 else "NO", cp])
    return md_table(header, rows)


def table_markdown(rows: list[MomentRow]) -> str:
    header = ["model", "prompt set", "μ (nats)", "μ₂ = E[Σp ln²p]", "E[H²]", "Var(Y)", "SE μ (prompt)",
              "SE μ₂ (prompt)", "positions", "share H < 0.1"]
    return md_table(header, [[r.model, r.set, fmt(m.mu, 4), fmt(m.mu2, 4), fmt(m.mean_H2, 4), fmt(m.var_surprisal, 4),
                              fmt(m.se_mu_prompt, 4), fmt(m.se_mu2_prompt, 4), str(m.n), fmt(m.frac_H_below_0p1, 2)]
                             for r, m in ((r, r.moments) for r in rows)])


def _texts(cfg) -> str:
    texts = getattr(cfg, "texts_per_prompt", 1)
    return f"{cfg.n_prompts} prompts" + (f" × {texts} texts" if texts > 1 else "")


def _llm_sections(result: PankratovResult) -> list[str]:
    llm, cfg = result.llm, result.llm_config
    counts = "; ".join(f"{res.set} {_texts(res.config)}" for res in llm.analyses) or f"{cfg.n_prompts} prompts"
    lines = ["## (i) Table in kind: surprisal moments per model × prompt set", "",
             f"Each model samples its own continuations at T = {cfg.temperature:g} (no top-k/top-p), up to "
             f"{cfg.tokens} tokens each (stopping at EOS), from the first prompts of each set — the target: {counts}; "
             "the other models: the first prompts listed in the positions column. H and Σ p ln² p are evaluated at "
             "every generated position. SEs are across prompts (positions within a sample are correlated, and "
             "samples of one prompt too)."]
    if llm.skipped_models:
        lines.append(f"Skipped: {', '.join(llm.skipped_models)}.")
    lines += ["", table_markdown(llm.table), "", "![moments](moments.png)", "",
              "## (ii) Fig. 2 in kind: speed-up vs capacity P", "",
              "Top row: the paper's constant-time model (a target call costs the same for any P and drafting is "
              "free), where the speed-up is τ = E[X] + 1. Bottom row: wall-clock estimate τ·t(1)/(draft seconds per "
              "round + t(P+1)) with the target's measured t(k) on this CPU (oracle and bound with free drafting). "
              "The chain drafter samples its drafts and is verified by rejection sampling: it is a *randomised* "
              "strategy, outside the scope of the bound (which covers deterministic trees such as the dynamic drafter "
              "and the oracle). Drafter lines use the exact E[X | drafted tree] + 1 at the oracle's positions (one "
              "dynamic tree and one sampled chain of P_max nodes per position, nested in P, scored by one target "
              "pass; for the chain the acceptance coins are integrated out) when available; open markers are τ "
              "measured in short tree-SD runs (few rounds at large P: noisy). In the tables, the drafters' exact "
              "values sit on a subset of the oracle's positions: the last column is the oracle on the same "
              "positions, which the dynamic tree never exceeds (a deterministic tree), while the rejection-verified "
              "chain can (for one drafted token its acceptance is 1 − TV(draft, target), which exceeds the "
              "one-node oracle max q whenever the draft's law is close to a flat target's)."]
    lines.append(f"Target `{llm.target_precision}`" + (f" ({llm.target_kernels})" if llm.target_kernels else "")
                 + f", int8 draft; wall-clock numbers measured with {llm.torch_threads} torch thread(s) on this "
                 "machine (τ, E[X] and the moments do not depend on the machine; t(k) and draft seconds do).")
    lines += ["", "![Fig. 2 in kind](fig2_speedup.png)", ""]
    for res in llm.analyses:
        m, sd = res.moments, res.oracle_sd
        lines += [f"### {res.set}", "",
                  f"μ = {m.mu:.4f}, μ₂ = {m.mu2:.4f} ({m.n} positions). Oracle: "
                  f"{res.oracle.n_positions if res.oracle else 0} positions, one T*({max(cfg.capacities)}) each; "
                  f"oracle tree SD at P ∈ {sd.capacities if sd else []} ({sd.prompts if sd else 0} prompt × "
                  f"{sd.tokens_per_prompt if sd else 0} tokens); drafters {cfg.drafter_prompts} prompt(s) × "
                  f"{cfg.drafter_tokens} tokens per P. Full report: [analyze-{res.set}/report.md]"
                  f"(analyze-{res.set}/report.md).", "", per_p_table(res), "", speedup_table(res), ""]
        forms = {P: e.tightest for P, e in res.tightest_bound.items()}
        viol = {P: e.violated for P, e in res.tightest_bound.items() if e.violated}
        lines += [f"Tightest rigorous form per P: {forms}." + (f" Forms below the measured oracle: {viol}." if viol
                                                              else " All rigorous forms stay above the measured oracle."),
                  "", f"![E[X] vs P, {res.set}](analyze-{res.set}/expected_accepted.png)", ""]
    lines += ["Timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in llm.timings.items()), ""]
    return lines


def report_markdown(result: PankratovResult) -> str:
    lines = ["# Pankratov & Alistarh 2026 — speculative-decoding speed-of-light, reproduced in kind", "",
             f"Generated {result.finished} in {result.seconds:.0f} s ({'quick' if result.quick else 'full'} mode). "
             "Natural logs (nats) throughout; X = accepted draft tokens per target call (bonus token not counted); "
             "τ = tokens per target call = speed-up under the paper's constant-time model. μ₂ is E[Y²] = "
             "E[Σ p ln² p] (docs/paper-notes.md, Pankratov §3.1: the strong inference); E[H²] is listed for "
             "the other reading. None of the paper's numbers are available: everything below is re-measured.", ""]
    if result.augmented:
        lines += [f"Exact per-position drafter values were added afterwards (`--augment`, {result.augmented.finished}, "
                  f"{result.augmented.seconds:.0f} s) on the same prompts, samples and oracle positions.", ""]
    if result.llm is None:
        lines += [f"**LLM parts skipped**: {result.llm_note}", ""]
    else:
        if result.claims is not None:
            cfg = result.llm_config
            per_set = "; ".join(f"{res.set}: {_texts(res.config)}, {res.config.oracle_positions} oracle positions"
                                for res in result.llm.analyses)
            sizes = (f"up to {cfg.tokens} sampled tokens per text for the moments ({per_set}; one "
                     f"T*({max(cfg.capacities)}) per position), exact drafter values at "
                     f"{cfg.drafter_positions if cfg.drafter_positions is not None else 'every'} of the positions")
            lines += [claims_markdown(result.claims, result.seconds, sizes), ""]
        lines += _llm_sections(result)
    synth = result.synthetic
    lines += ["## (iii) Synthetic i.i.d. checks: slope of E[X*] vs ln P = 1/μ", "",
              "E[X | T*(P)] from the exact best-first search (one search at P_max; nested trees give every smaller P). "
              "Slope fitted by least squares on a geometric grid of P. T3c and T3d are (near-)lattice laws, for which "
              "E* oscillates around the asymptote. T4: mean ± SE of per-environment slopes over "
              f"{synth.cases[-1].n_envs} environments.", "", synthetic_markdown(synth), "",
              f"All slopes within {synth.tolerance:.0%} of 1/μ: **{synth.all_within_tolerance}**; all bounds hold: "
              f"**{synth.all_bounds_hold}**.", "", "![synthetic slopes](synthetic_slopes.png)", ""]
    return "\n".join(lines)


def render(result: PankratovResult, out, log=print) -> None:
    """(Re)write every report file of a finished result into ``out``."""
    from . import plots

    out = Path(out)
    plots.pankratov_synthetic(result.synthetic, out / "synthetic_slopes.png")
    if result.llm is not None:
        for res in result.llm.analyses:
            write_report(res, out / f"analyze-{res.set}")
        plots.pankratov_moments(result.llm.table, out / "moments.png")
        plots.pankratov_fig2(result.llm.analyses, out / "fig2_speedup.png")
    write_json(result, out / "results.json")
    md = report_markdown(result)
    write_text(out / "report.md", md)
    write_text(out / "report.html", markdown_to_html(md, title="specbound reproduce pankratov"))
    log(f"wrote {out}/results.json, report.md, report.html and PNGs")
