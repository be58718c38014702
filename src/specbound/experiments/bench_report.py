"""Tables of a :class:`~specbound.experiments.bench.BenchResult` (markdown; JSON via report.py)."""
from __future__ import annotations

from .bench import BENCH_METHODS, SPECBOUND_METHODS, BenchResult
from .report import fmt, md_table

__all__ = ["bench_markdown"]


def _ratio(entry) -> str:
    return "–" if not entry else f"{entry['median']:.2f}× (min {entry['min']:.2f}×)"


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
              "token (HF runs with min_new_tokens, which masks EOS; specbound writes it and goes on).", ""]
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
        mine = [r for r in result.rows if r.mode == mode]
        methods = [m for m in BENCH_METHODS if m in per]
        lines += [f"Per prompt ({mode}), end-to-end tok/s:", "",
                  md_table(["prompt"] + methods, [[r.prompt] + [fmt(r.runs[m].tokens_per_second, 2) if m in r.runs
                                                                else "–" for m in methods] for r in mine]), ""]
        detail = []
        for r in mine:
            for m in SPECBOUND_METHODS:
                if m in r.runs:
                    x = r.runs[m]
                    detail.append([r.prompt, m, fmt(x.tau, 2), fmt(x.drafted_per_round, 1), fmt(x.depth_per_round, 1),
                                   str(x.plain_steps), fmt(x.draft_seconds, 1), fmt(x.target_seconds, 1)])
        if detail:
            lines += [f"specbound rounds ({mode}):", "",
                      md_table(["prompt", "method", "τ", "drafted/round", "depth/round", "plain steps", "draft s",
                                "target s"], detail), ""]
    return "\n".join(lines) + "\n"
