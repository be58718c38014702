"""`specbound analyze`, the report: markdown tables, PNGs, JSON and HTML of one :class:`SetAnalysis`."""
from __future__ import annotations

from pathlib import Path

from ..theory.bounds import BOUND_FORMS, bound_is_valid
from .analyze import SetAnalysis
from ..measure.drafter_values import EXACT_KINDS
from .report import fmt, markdown_to_html, md_table, pm, to_jsonable, write_json, write_text

__all__ = ["drafter_cost_table", "per_p_table", "set_report_markdown", "speedup_table", "write_report"]


def _exact_kinds(result: SetAnalysis) -> list[str]:
    exact = result.drafter_exact
    return [k for k in EXACT_KINDS if exact is not None and exact.of(k) is not None and exact.of(k).mean]


def _exact_label(kind: str) -> str:
    return "chain, block verification" if kind == "chain_block" else kind


def per_p_table(result: SetAnalysis) -> str:
    """E[X] per P: oracle (exact, empirical), bound forms, drafters (τ runs and exact values)."""
    caps = result.config.capacities
    oracle = result.oracle
    sd = result.oracle_sd.by_capacity if result.oracle_sd else {}
    header = ["P", "oracle E[X*] (exact; ± SE by sampled text)", "oracle SD: mean X / mean E[X|T] (rounds)"]
    header += [f"bound: {f}" if f != "asymptotic" else "asymptotic (approximation, not a bound)" for f in BOUND_FORMS]
    header += [f"{k}: E[X] (τ)" for k in result.drafters]
    exact_kinds = _exact_kinds(result)
    same = _oracle_at_drafter_positions(result) if exact_kinds else None
    n_exact = result.drafter_exact.n_positions if exact_kinds else 0
    header += [f"{_exact_label(k)}: exact E[X|T] at {n_exact} oracle positions" for k in exact_kinds]
    header += [f"oracle E[X*] at the same {n_exact} positions"] if same is not None else []
    rows = []
    for i, P in enumerate(caps):
        row = [str(P), pm(oracle.mean[i], (oracle.se_by_sample or oracle.se)[i]) if oracle else "–"]
        s = sd.get(P)
        row.append(f"{fmt(s.mean_X, 2)} / {fmt(s.mean_value, 2)} ({s.rounds})" if s else "–")
        row += [fmt(result.bounds[f][i]) + (" (not a bound, P < 3)" if f == "published" and not bound_is_valid(f, P)
                                            else "") for f in BOUND_FORMS]
        for runs in result.drafters.values():
            r = runs.by_capacity.get(P)
            row.append(f"{fmt(r.mean_accepted, 2)} ({fmt(r.tau, 2)})" if r else "–")
        for k in exact_kinds:
            e = result.drafter_exact.of(k)
            row.append(pm(e.mean[i], e.se[i] if e.se else None))
        if same is not None:
            row.append(fmt(same[i]))
        rows.append(row)
    return md_table(header, rows)


def _oracle_at_drafter_positions(result: SetAnalysis):
    """The oracle's mean per P over the rows that have exact drafter values (None when unknown): the
    drafters' columns are on those rows only, and a dynamic tree never beats T*(P) on the same row."""
    o, exact = result.oracle, result.drafter_exact
    rows = list(exact.oracle_indices) if exact is not None else []
    if o is None or exact is None or not exact.n_positions:
        return None
    if not rows and exact.n_positions == o.n_positions:
        rows = list(range(o.n_positions))
    if len(rows) != exact.n_positions:
        return None
    arr = o.table()
    return arr[rows].mean(axis=0).tolist()


def speedup_table(result: SetAnalysis) -> str:
    rows_in = result.speedups.rows
    kinds = list(result.drafters)
    ex = [k for k in kinds + ["chain_block"] if f"{k}_exact" in rows_in[0].const]
    header = ["P", "t(P+1)/t(1)", "const: renewal+1", "const: oracle E[X*]+1"] + [f"const: {k} τ (run)" for k in kinds]
    header += [f"const: {_exact_label(k)} exact+1" for k in ex]
    header += ["wall: renewal (free draft)", "wall: oracle (free draft)"] + [f"wall: {k} (run τ)" for k in kinds]
    header += [f"wall: {_exact_label(k)} (exact)" for k in ex]
    rows = []
    for r in rows_in:
        row = [str(r.P), fmt(r.t_P_plus_1 / r.t_1, 2), fmt(r.const["renewal"], 2), fmt(r.const.get("oracle"), 2)]
        row += [fmt(r.const.get(k), 2) for k in kinds]
        row += [fmt(r.const.get(f"{k}_exact"), 2) for k in ex]
        row += [fmt(r.wall["renewal_free_drafting"], 2), fmt(r.wall.get("oracle_free_drafting"), 2)]
        row += [fmt(r.wall.get(k), 2) for k in kinds]
        row += [fmt(r.wall.get(f"{k}_exact"), 2) for k in ex]
        rows.append(row)
    return md_table(header, rows)


def drafter_cost_table(result: SetAnalysis) -> str:
    header = ["drafter", "P", "τ", "draft s/round", "target s/round", "draft calls/round", "rounds"]
    rows = []
    for kind, runs in result.drafters.items():
        for P, r in runs.by_capacity.items():
            rows.append([kind, str(P), fmt(r.tau, 2), fmt(r.draft_seconds_per_round, 3),
                         fmt(r.target_seconds_per_round, 3), fmt(r.draft_calls_per_round, 1), str(r.rounds)])
    return md_table(header, rows)


def tightest_bound_sentence(result: SetAnalysis) -> str:
    tb = result.tightest_bound
    viol = {P: e.violated for P, e in tb.items() if e.violated}
    forms = sorted({e.tightest for e in tb.values()})
    return (f"Tightest rigorous form at the measured μ, μ₂: {', '.join(forms)}"
            + (f"; forms below the measured oracle (i.i.d. assumption violated on real text): {viol}"
               if viol else "; every rigorous form stays above the measured oracle E[X*]."))


def set_report_markdown(result: SetAnalysis, images: dict[str, str], title: str | None = None, level: int = 1) -> str:
    """Markdown section for one analysed prompt set; ``images`` maps captions to relative PNG paths."""
    h = "#" * level
    cfg, m = result.config, result.moments
    oracle_n = result.oracle.n_positions if result.oracle else 0
    reads = result.oracle.reads_total if result.oracle else 0
    sd = result.oracle_sd
    lines = [f"{h} {title or 'specbound analyze: ' + result.set}", "",
             f"Target `{result.target}`, draft `{result.draft}` ({result.draft_backend}), temperature "
             f"{cfg.temperature:g}, {result.torch_threads} torch threads. Nats throughout; X = accepted draft "
             "tokens per round (bonus token not counted), τ = tokens per target call.", "",
             f"{h}# Measurement sizes", "",
             f"- (a) moments: {m.n_prompts} prompts × up to {cfg.tokens} sampled tokens (stop at EOS) → {m.n} positions",
             f"- (b) oracle T*(P) exact: {oracle_n} positions spread over those samples, one T*({max(cfg.capacities)}) "
             f"each (nested), {reads} batched target reads (width {cfg.oracle_width})",
             f"- (b) oracle tree SD: P ∈ {sd.capacities if sd else []}, {sd.prompts if sd else 0} prompt(s) × "
             f"{sd.tokens_per_prompt if sd else 0} tokens",
             f"- (d) drafters {list(result.drafters)}: P ∈ {list(cfg.capacities)}, {cfg.drafter_prompts} prompt(s) × "
             f"{cfg.drafter_tokens} tokens per P (measured τ; few rounds at large P, see the cost table)",
             f"- (d, exact) drafter trees at {result.drafter_exact.n_positions if result.drafter_exact else 0} of the "
             f"oracle's {oracle_n} positions (evenly spaced among them): one dynamic tree and one sampled chain of P_max nodes per position (nested in P), scored by "
             "one target pass each; E[X|T] exact (chain: acceptance coins integrated out)",
             f"- (e) t(k): median of {cfg.cost_repeats} target passes per k after the first prompt",
             "- timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in result.timings.items()), "",
             f"{h}# Moments of the target", "",
             md_table(["μ", "μ₂ = E[Σp ln²p]", "E[H²]", "Var(Y) = μ₂ − μ²", "SE μ (pos / prompt)",
                       "SE μ₂ (pos / prompt)", "positions", "share H < 0.1"],
                      [[fmt(m.mu, 4), fmt(m.mu2, 4), fmt(m.mean_H2, 4), fmt(m.var_surprisal, 4),
                        f"{fmt(m.se_mu, 4)} / {fmt(m.se_mu_prompt, 4)}", f"{fmt(m.se_mu2, 4)} / {fmt(m.se_mu2_prompt, 4)}",
                        str(m.n), fmt(m.frac_H_below_0p1, 2)]]), "",
             f"{h}# E[X] per capacity P", "", per_p_table(result), ""]
    if result.tightest_bound:
        lines += [tightest_bound_sentence(result), ""]
    lines += [f"{h}# Speed-ups", "",
              "`const` = the paper's constant-time model (one target call costs the same for any P, drafting free): "
              "speed-up = τ. `wall` = τ·t(1)/(draft s per round + t(P+1)) with the measured t(k); oracle and bound "
              "with free drafting.", "", speedup_table(result), "", drafter_cost_table(result), ""]
    for caption, rel in images.items():
        lines += [f"![{caption}]({rel})", ""]
    return "\n".join(lines)


def write_report(result: SetAnalysis, out_dir, name: str = "analyze") -> dict[str, Path]:
    """JSON + PNGs + markdown + HTML for one analysed set into ``out_dir``; returns the paths."""
    from . import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": write_json(to_jsonable(result), out / f"{name}.json")}
    paths["expected_accepted"] = plots.pankratov_expected_accepted(result, out / "expected_accepted.png")
    paths["speedup"] = plots.pankratov_speedup(result, out / "speedup.png")
    images = {f"E[X] vs P ({result.set})": "expected_accepted.png", f"speed-up vs P ({result.set})": "speedup.png"}
    md = set_report_markdown(result, images)
    paths["markdown"] = write_text(out / "report.md", md)
    paths["html"] = write_text(out / "report.html", markdown_to_html(md, title=f"specbound analyze {result.set}"))
    return paths
