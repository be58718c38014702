"""Tables of a :class:`~specbound.experiments.bench.BenchResult` (markdown; JSON via report.py)."""
from __future__ import annotations

from .bench import BENCH_METHODS, SPECBOUND_METHODS, BenchResult
from .report import fmt, md_table

__all__ = ["bench_markdown"]


def _ratio(entry) -> str:
    return "–" if not entry else f"{entry['median']:.2f}× (min {entry['min']:.2f}×)"


_REF_NAMES = {"vs_generate": "HF generate", "vs_assisted_int8": "HF assisted-int8 (best)",
              "vs_llamacpp": "llama.cpp plain (decode)"}


def _pm(entry) -> str:
    return f"{entry['ratio']:.2f}×" + ("" if entry["se"] is None else f" ± {entry['se']:.2f}")


def pooled_line(pooled: dict) -> str:
    """``ratio 1.18× (95% CI 1.07–1.30), n = 8 prompts × 3 seeds``."""
    ci = ("no interval (one pair)" if pooled["low"] is None
          else f"95% CI {pooled['low']:.2f}–{pooled['high']:.2f}")
    return f"ratio {pooled['ratio']:.2f}× ({ci}), n = {pooled['prompts']} prompts × {pooled['seeds']} seeds"


def _paired_section(mode: str, paired: dict) -> list[str]:
    comps = [(m, key, c) for m, by_ref in paired["comparisons"].items() for key, c in by_ref.items()]
    if not comps:
        return []
    lines = [f"### {mode}: {paired['prompts']} prompts × {paired['seeds']} paired seeds", "",
             paired["pairing"] + " Per prompt: the ratio of mean tok/s over the seeds ± its delta-method standard "
             "error. Pooled: the geometric mean of the prompts × seeds paired ratios, standard error clustered by "
             "prompt, 95% interval with the Student t quantile on prompts − 1 degrees of freedom.", ""]
    prompts = list(dict.fromkeys(e["prompt"] for _, _, c in comps for e in c["per_prompt"]))
    header = ["prompt"] + [f"{m} vs {_REF_NAMES.get(key, c['reference'])}" for m, key, c in comps]
    table = []
    for p in prompts:
        cells = [p]
        for _, _, c in comps:
            e = next((x for x in c["per_prompt"] if x["prompt"] == p), None)
            cells.append("–" if e is None else _pm(e))
        table.append(cells)
    lines += [md_table(header, table), ""]
    tau = paired["median_tau"]
    for m, key, c in comps:
        lines.append(f"- {m} vs {_REF_NAMES.get(key, c['reference'])} ({c['reference']}): {pooled_line(c['pooled'])}; "
                     f"median τ {fmt(tau.get(m), 2)} (reference {fmt(tau.get(c['reference']), 2)})")
    return lines + [""]


def bench_markdown(result: BenchResult, command: str = "") -> str:
    c = result.config
    lines = [f"# specbound bench: {c.prompt_set} prompts {c.offset}–{c.offset + c.n_prompts - 1} (held out), "
             f"{c.max_new_tokens} new tokens", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["Models: " + ", ".join(f"{k} = {v}" for k, v in result.models.items()),
              f"Machine: {result.machine}", "",
              "All methods in one process, interleaved per prompt in a rotated order; medians over prompts; "
              "ratios are per prompt (median and minimum). τ = tokens per target forward. "
              "\"greedy = generate\": the same tokens as HF generate up to the method's first end-of-sequence "
              "token (HF runs with min_new_tokens, which masks EOS; specbound writes it and goes on)."
              + (f" Sampled modes ran {c.seeds} paired seeds per prompt (medians are then over prompt × seed; "
                 "greedy ran once)." if getattr(c, "seeds", 1) > 1 else ""), ""]
    for mode, summary in result.summary.items():
        per = summary["methods"]
        lines += [f"## {mode}", "", f"Reference HF assisted-int8 configuration: {summary['best_assisted_int8']}", ""]
        rows = []
        for m in BENCH_METHODS:
            if m not in per:
                continue
            s = per[m]
            ident = "" if s["identical"] is None else f"{s['identical']}/{s['prompts']}"
            rows.append([m, fmt(s["median_tokens_per_second"], 2), fmt(s.get("median_decode_tokens_per_second"), 2),
                         fmt(s["median_tau"], 2), ident, _ratio(s.get("vs_generate")),
                         _ratio(s.get("vs_assisted_int8")), _ratio(s.get("vs_llamacpp"))])
        lines += [md_table(["method", "tok/s (end to end)", "decode tok/s", "τ", "greedy = generate",
                            "vs HF generate", "vs HF assisted-int8 (best)", "decode vs llama.cpp plain"], rows), ""]
        if summary.get("paired"):
            lines += _paired_section(mode, summary["paired"])
        mine = [r for r in result.rows if r.mode == mode]
        methods = [m for m in BENCH_METHODS if m in per]
        seeded = any(r.seed_index for r in mine)

        def name(r) -> str:
            return f"{r.prompt} #{r.seed_index}" if seeded else r.prompt

        lines += [f"Per prompt ({mode}), end-to-end tok/s:", "",
                  md_table(["prompt"] + methods, [[name(r)] + [fmt(r.runs[m].tokens_per_second, 2) if m in r.runs
                                                                else "–" for m in methods] for r in mine]), ""]
        detail = []
        for r in mine:
            for m in SPECBOUND_METHODS:
                if m in r.runs:
                    x = r.runs[m]
                    detail.append([name(r), m, fmt(x.tau, 2), fmt(x.drafted_per_round, 1), fmt(x.depth_per_round, 1),
                                   str(x.plain_steps), fmt(x.draft_seconds, 1), fmt(x.target_seconds, 1)])
        if detail:
            lines += [f"specbound rounds ({mode}):", "",
                      md_table(["prompt", "method", "τ", "drafted/round", "depth/round", "plain steps", "draft s",
                                "target s"], detail), ""]
    return "\n".join(lines) + "\n"
