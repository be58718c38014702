"""Report of `specbound advise`: tables (markdown → HTML) and the speed-up figure (PNG)."""
from __future__ import annotations

import statistics
from pathlib import Path

from ..advise import PAYS, Advice, measured_vs_predicted
from .report import fmt, markdown_to_html, md_table, write_json, write_text

__all__ = ["advise_markdown", "plot_advice", "write_advice"]


#: Above this spread of t(k) or d(k) at k ≤ 8 the report warns that the calibration was noisy.
NOISY_CALIBRATION = 0.25


def _measured(value, spread) -> str:
    if value is None:
        return "–"
    return fmt(value, 1) + (f" ({spread[0]:.1f}–{spread[1]:.1f})" if spread and spread[0] != spread[1] else "")


def _ratio(measured, predicted) -> str:
    return "–" if measured is None or not predicted else f"{measured / predicted:.2f}"


def _batch_check_lines(batch) -> list[str]:
    """Median |m/p − 1| over the batch sizes, plain and SD (the bar: within 15% per B)."""
    checked = [b for b in batch.values() if b.measured_plain is not None]
    if not checked:
        return []
    errors = [abs(b.measured_plain / b.plain - 1) for b in checked] + \
        [abs(b.measured_speculative / b.speculative - 1) for b in checked if b.gamma > 0]
    within = sum(e <= 0.15 for e in errors)
    return [f"Measured / predicted over the batch sizes: median |m/p − 1| = {statistics.median(errors):.0%} "
            f"({within} of {len(errors)} figures within 15%).", ""]


def _batch_pass_lines(batch: dict, context: int | None = None) -> list[str]:
    """How the batch sizes were priced: the passes and round work measured at each B on the
    calibration prompts (``measure/batch_passes.py``; cut or extended to ``context`` tokens), or the
    single-row curves alone."""
    measured = [(B, b.passes) for B, b in sorted(batch.items()) if b.passes is not None]
    if not measured:
        return ["Priced from the single-row cost curves alone (B rows as one row reading B tokens per request; no "
                "work outside the passes).", ""]
    g1, g2 = measured[0][1].gammas
    where = "the calibration prompts" if context is None else \
        f"the calibration prompts brought to {context} tokens (the held-out prompts' median length, plus half the " \
        "extra tokens they decode, unless --batch-context says otherwise: a pass over B rows costs more as " \
        "their caches grow)"
    return [f"Priced with what B rows measured on {where} (plain batched decoding and chains of "
            f"γ = {g1} and {g2}, greedy): the target's passes as measured/predicted by its one-row curve, the "
            "draft's seconds per drafted round and the seconds per round outside the passes (a drafted round at "
            "another γ: the line through the two):", "",
            md_table(["B", "target pass ×", f"draft ms/round γ={g1}", f"γ={g2}", "work ms, plain round",
                      f"drafted γ={g1}", f"γ={g2}", "rounds"],
                     [[str(B), f"{p.target_ratio:.2f}", f"{1e3 * p.draft_round[0]:.1f}", f"{1e3 * p.draft_round[1]:.1f}",
                       f"{1e3 * p.plain_work:.1f}", f"{1e3 * p.drafted_work[0]:.1f}", f"{1e3 * p.drafted_work[1]:.1f}",
                       str(p.rounds)] for B, p in measured]), ""]


def _measured_best_lines(advice: Advice) -> list[str]:
    """Where the checks measured another setting faster than the recommended one, say so: the
    recommendation (and the exports) follow the prediction, the user may prefer the measurement."""
    lines = []
    for mode, m in advice.modes.items():
        if m.best is None or m.best.measured is None or not m.pays:
            continue
        top = m.best_measured
        if top.label != m.best.label and top.measured > m.best.measured:
            lines += [f"Measured best of the checked settings ({mode}): **{top.label}**, {top.measured:.2f}× "
                      f"(predicted {top.predicted:.2f}×), where the recommended {m.best.label} measured "
                      f"{m.best.measured:.2f}× ({top.measured / m.best.measured - 1:+.0%}); a few held-out prompts "
                      "on a machine whose plain decoding moves by ~10% between runs — run it on your prompts "
                      f"(`specbound generate {top.command()}`) before trusting either.", ""]
    return lines


def _perfect(b) -> str:
    """The perfect-draft bound of one batch size: total tok/s (× plain, its chain length)."""
    if b.perfect_draft is None:
        return "–"
    return f"{fmt(b.perfect_draft, 1)} ({b.perfect_draft / b.plain:.2f}×, γ {b.perfect_draft_gamma})"


def _context_line(c) -> str:
    """What the context drafter (no draft model) did on the calibration prompts, and whether it paid."""
    line = (f"Context drafts (no draft model, `--draft none`): something to draft in {c.drafted_rounds:.0%} of "
            f"rounds, {c.acceptance:.0%} of drafted tokens accepted, τ = {c.tau:.2f}")
    if c.measured is None:
        return line + "."
    verdict = "pays" if c.pays else "does not pay alone"
    return line + f"; measured {c.measured:.2f}× plain decoding on the held-out prompts: it {verdict}."


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def advise_markdown(advice: Advice, exports: dict[str, str], command: str = "") -> str:
    c = advice.config
    lines = [f"# specbound advise — {c.engine} engine", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [f"Target {advice.models['target']}, draft {advice.models['draft']}; calibration prompts "
              f"{c.prompt_set} {c.offset}–{c.offset + c.n_prompts - 1} ({c.tokens} tokens each), "
              f"{c.positions} positions for tree values; measured in {advice.seconds:.0f} s.", "",
              "## Cost curve of this engine (median of repeats; spread = (max − min)/median)", "",
              md_table(["k", "target t(k) ms", "t(k)/t(1)", "spread", "draft d(k) ms", "spread"],
                       [[str(k), fmt(t, 1), fmt(t / advice.costs['target_ms'][0], 2), f"{ts:.0%}", fmt(d, 1), f"{ds:.0%}"]
                        for k, t, ts, d, ds in zip(advice.costs["ks"], advice.costs["target_ms"],
                                                   advice.costs["target_spread"], advice.costs["draft_ms"],
                                                   advice.costs["draft_spread"])]), "",
              f"Target entropy moments at T = 1: μ = {advice.moments.mu:.3f} nats, μ₂ = {advice.moments.mu2:.3f} nats².", ""]
    noisy = max(list(advice.costs["target_spread"][:4]) + list(advice.costs["draft_spread"][:4]), default=0.0)
    if noisy > NOISY_CALIBRATION:
        lines += [f"**Warning: the cost curve was measured on a busy machine** (spread up to {noisy:.0%} at k ≤ 8): "
                  "every prediction below is priced with it. Run `advise` again when nothing else runs.", ""]
    for mode, m in advice.modes.items():
        lines += [f"## {mode}", ""]
        verdict = (f"**Recommended: {m.best.kind} {'γ' if m.best.kind == 'chain' else 'P'} = {m.best.size}, predicted "
                   f"{m.best.predicted:.2f}× plain decoding.**" if m.pays else
                   f"**Speculation will not pay here: the best predicted speed-up is {m.best.predicted:.2f}× "
                   f"(< {PAYS}×). Decode plainly.**")
        sol = max(m.speed_of_light.items(), key=lambda kv: kv[1]) if m.speed_of_light else None
        lines += [verdict, ""]
        if m.context is not None:
            lines += [_context_line(m.context), ""]
        if sol:
            lines += [f"Speed of light with this cost curve (the target drafting its own optimal tree T*(P) for "
                      f"free): {sol[1]:.2f}× at P = {sol[0]}.", ""]
        lines += ["Chain (acceptance per position: " + ", ".join(f"{a:.2f}" for a in m.acceptance[:8]) + " …)", "",
                  md_table(["γ", "E[tokens/round]", "draft s/round", "predicted", "measured"],
                           [[str(g), fmt(s.expected_tokens, 2), fmt(s.draft_seconds, 3), _x(s.predicted), _x(s.measured)]
                            for g, s in m.chain.items() if g in (1, 2, 3, 4, 6, 8, 12, 16) or s.measured is not None]),
                  "", ("Dynamic tree (tokens per round of its rounds along the target's greedy texts; draft reads "
                       "priced by d(k)) against the optimal tree:" if mode == "greedy" else
                       "Dynamic tree (exact E[X | T_dyn(P)] at sampled positions; draft reads priced by d(k)) "
                       "against the optimal tree and the bound:"),
                  "", md_table(["P", "1 + E[X]", "draft s/round", "predicted", "measured", "1 + E[X*] (oracle)",
                                "speed of light", "bound speed-up"],
                               [[str(P), fmt(s.expected_tokens, 2), fmt(s.draft_seconds, 3), _x(s.predicted),
                                 _x(s.measured), fmt(1 + m.oracle.get(P, float("nan")), 2),
                                 _x(m.speed_of_light.get(P)), _x(m.bound_speedup.get(P))]
                                for P, s in m.tree.items()]), ""]
        if m.block:
            b = m.best_block
            lines += ["Chain with block verification (Sun et al. 2025; `--verification block`): exact tokens per "
                      "round of the same sampled chains under token-wise and block verification at the positions "
                      "above (their ratio is the verifier's gain alone); a block setting is priced as the chain "
                      "of its γ with that gain:", "",
                      md_table(["γ", "1 + E[X] token-wise", "1 + E[X] block", "gain", "tokens/round (chain × gain)",
                                "predicted", "measured"],
                               [[str(g), fmt(m.block_token.get(g, float("nan")), 3),
                                 fmt(m.block_positions.get(g, s.expected_tokens), 3),
                                 f"{m.block_positions.get(g, s.expected_tokens) / m.block_token[g] - 1:+.1%}"
                                 if m.block_token.get(g) else "–", fmt(s.expected_tokens, 2),
                                 _x(s.predicted), _x(s.measured)]
                                for g, s in m.block.items() if g in (1, 2, 4, 8, 12, 16) or s.measured is not None
                                or s is b]), "",
                      f"Best with block verification: γ = {b.size}, predicted {b.predicted:.2f}× (serving engines "
                      "verify token-wise, so the exports below use the best of the chains and trees).", ""]
        if m.shapes:
            lines += ["Sampled trees and M i.i.d. drafts, verified by recursive rejection over siblings (Yin et al. "
                      "2024, Alg. 4 at every depth; specbound's engine only): exact 1 + E[X | drafted tree] of the "
                      "engine's own drafter at the positions above, its draft calls priced by d(k):", "",
                      md_table(["setting", "`specbound generate`", "1 + E[X]", "nodes verified", "draft s/round",
                                "predicted", "measured"],
                               [[s.label, f"`{s.command()}`", fmt(s.expected_tokens, 2), str(s.verified_tokens - 1),
                                 fmt(s.draft_seconds, 3), _x(s.predicted), _x(s.measured)] for s in m.shapes]), ""]
        engine_best = m.best_engine
        if engine_best is not None and mode != "greedy":
            lines += [f"Best of everything specbound's engine runs at this temperature: **{engine_best.label}**, "
                      f"predicted {engine_best.predicted:.2f}× (`specbound generate {engine_best.command()}`)"
                      + (f", measured {engine_best.measured:.2f}×" if engine_best.measured is not None else "") + ".",
                      ""]
    for mode, m in advice.modes.items():
        if not m.batch:
            continue
        lines += [f"## Batched requests ({mode}): total tokens per second per batch size B", "",
                  "Predicted from the cost curve and the chain's acceptance above (a shared target pass over every "
                  "request's tokens, shared draft passes; `theory/speedup.py`); measured with "
                  "`speculative_decode_batch` / `autoregressive_decode_batch` on the held-out prompts (every prompt "
                  "at every B: ⌈prompts/B⌉ batches of B requests, the last one filled by cycling, each run "
                  "`--check-runs` times, plain and SD paired; tokens after the prefill over the batch's wall time "
                  "after its prefill): the median over those batches, the slowest–fastest in brackets, and "
                  "measured / predicted (m/p).", "",
                  md_table(["B", "plain pred.", "plain meas.", "plain m/p", "best γ", "SD pred.", "SD meas.", "SD m/p",
                            "SD/plain pred.", "SD/plain meas.", "batches", "speed of light (P)",
                            "perfect draft (×plain, γ)"],
                           [[str(B), fmt(b.plain, 1), _measured(b.measured_plain, b.measured_plain_range),
                             _ratio(b.measured_plain, b.plain), str(b.gamma), fmt(b.speculative, 1),
                             _measured(b.measured_speculative, b.measured_speculative_range),
                             _ratio(b.measured_speculative, b.speculative), _x(b.speedup),
                             _x(None if b.measured_plain is None or b.measured_speculative is None
                                else b.measured_speculative / b.measured_plain), str(b.measured_batches or "–"),
                             f"{fmt(b.speed_of_light, 1)} ({b.speed_of_light_capacity})", _perfect(b)]
                            for B, b in sorted(m.batch.items())]), "",
                  "Speed of light: the target's own optimal tree T*(P) drafted for free. Perfect draft: THIS "
                  "draft's passes with every drafted token accepted (`theory.speedup.perfect_draft_throughput`) — "
                  "no drafter of this cost exceeds it at that B, whatever its acceptance; where it is ≤ 1× plain, "
                  "speculation with this draft cannot pay at that batch size on this machine.", "",
                  *_batch_check_lines(m.batch),
                  *_batch_pass_lines(m.batch, c.batch_context),
                  "Draft length per batch size for a serving engine (vLLM / SGLang users write this table by hand; "
                  "0 = do not speculate at that size): `" + ", ".join(f"{B}: {b.gamma}" for B, b in
                                                                       sorted(m.batch.items())) + "`", ""]
    rows = measured_vs_predicted(advice)
    if rows:
        errors = [abs(r[4] - 1) for r in rows]
        streams = (f"; {advice.measured_streams} runs per prompt and setting, each paired with a plain run "
                   "(T > 0: different random streams)")
        lines += ["## Predicted vs measured (held-out prompts: " + ", ".join(advice.measured_prompts) + streams +
                  "; median over prompts of each prompt's mean ratio)", "",
                  md_table(["mode", "setting", "predicted", "measured", "measured / predicted"],
                           [[a, b, _x(p), _x(q), fmt(r, 2)] for a, b, p, q, r in rows]), "",
                  f"Median |measured/predicted − 1| = {statistics.median(errors):.0%} over {len(rows)} settings.", ""]
        lines += _measured_best_lines(advice)
    lines += ["## Export for serving engines", ""]
    for engine, text in exports.items():
        lines += [f"### {engine}", "", "```", text.rstrip(), "```", ""]
    return "\n".join(lines) + "\n"


def plot_advice(advice: Advice, path) -> Path:
    """The report's figure (:func:`.plots.advise_speedups`)."""
    from .plots import advise_speedups

    return advise_speedups(advice, path)


def write_advice(advice: Advice, exports: dict[str, str], out: Path, command: str = "") -> dict[str, Path]:
    text = advise_markdown(advice, exports, command)
    paths = {"json": write_json(advice, out / "advice.json"), "md": write_text(out / "advice.md", text),
             "png": plot_advice(advice, out / "advice.png")}
    paths["html"] = write_text(out / "advice.html", markdown_to_html(text.replace("advice.png", "advice.png")
                                                                      + "\n![speed-up](advice.png)\n",
                                                                      title="specbound advise"))
    return paths
