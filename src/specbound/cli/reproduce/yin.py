"""`specbound reproduce yin [--quick] [--skip-llm] [--resume] [...]`: Fig. 2-4 and Table 1 in kind."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from ...errors import SpecboundError
from ..arguments import at_least

HELP = "Yin et al. 2024: Fig. 2-4 and Table 1 in kind"

DEFAULT_OUT = "runs/reproduce-yin"


def add_arguments(parser) -> None:
    """Options of ``specbound reproduce yin``."""
    parser.add_argument("--quick", action="store_true",
                        help="small run for smoke tests (< 2 min; the LLM table is tiny or skipped)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--skip-llm", action="store_true", help="skip the real-model Table 1")
    parser.add_argument("--prompts", type=int, default=None, help="number of MT-Bench prompts for Table 1 "
                                                                  "(default 20; quick 2)")
    parser.add_argument("--prompt-offset", type=int, default=None,
                        help="first prompt of the set Table 1 uses (default 0; a replication on other prompts)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the chains, Monte Carlo and sampling")
    parser.add_argument("--samples", type=int, default=None, help="paired samples per prompt and ε (default 3)")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per response (default 32; quick 16)")
    parser.add_argument("--gamma", type=int, default=None, help="draft length per round in Table 1 (default 5)")
    parser.add_argument("--forms", choices=("auto", "additive", "ratio", "both"), default=None,
                        help="over-acceptance form(s) for Table 1: auto = ratio if additive saturates (its rows "
                             "would be ties), else additive (default)")
    parser.add_argument("--eps", default=None,
                        help="comma-separated over-acceptance thresholds ε > 0 for Table 1 (default 0.1,0.2,0.4,0.8; "
                             "quick 0.1,0.8)")
    parser.add_argument("--target-precision", choices=("int8", "fp32"), default=None,
                        help="the target Table 1 runs: int8 (default; the quantised target, 3-4x cheaper) or fp32")
    parser.add_argument("--mc-runs", type=int, default=None, help="NumPy Monte Carlo runs for Fig. 2a/b")
    parser.add_argument("--engine-runs", type=int, default=None, help="decoding-engine runs per Fig. 2 setting")
    parser.add_argument("--prompt-set", default=None, help="prompt set for Table 1 (default mtbench)")
    parser.add_argument("--llm-minutes", type=float, default=None,
                        help="time budget of Table 1 in minutes (default 50; quick: what is left of 105 s). "
                             "Whole (prompt, sample) units are dropped when it would be exceeded")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the real models (default: "
                                                                  "every core; give 1 when the CPU is shared)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted Table 1 in --out from its partial results (same options)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def settings_from_args(args):
    """Validated :class:`~specbound.experiments.yin.Settings` (SpecboundError before any work)."""
    from ...experiments.yin import Settings

    at_least(args, 1, "prompts", "samples", "tokens", "gamma", "threads")
    at_least(args, 2, "mc_runs")
    at_least(args, 0, "engine_runs", "seed", "prompt_offset")
    if args.llm_minutes is not None and not (math.isfinite(args.llm_minutes) and args.llm_minutes >= 0):
        raise SpecboundError(f"--llm-minutes must be a number >= 0, got {args.llm_minutes}")
    if args.prompt_set is not None:
        from ...assets.prompts import prompt_set_names

        if args.prompt_set not in prompt_set_names():
            raise SpecboundError(f"unknown --prompt-set {args.prompt_set!r}: use one of {', '.join(prompt_set_names())}")
    eps = None
    if args.eps is not None:
        try:
            eps = tuple(float(v) for v in args.eps.split(",") if v.strip())
        except ValueError:
            raise SpecboundError(f"--eps must be comma-separated numbers > 0, got {args.eps!r}") from None
        if not eps or any(not (math.isfinite(e) and e > 0) for e in eps) or len(set(eps)) != len(eps):
            raise SpecboundError(f"--eps must be distinct comma-separated numbers > 0, got {args.eps!r}")
    return Settings.make(
        args.quick, seed=args.seed, out=args.out, skip_llm=args.skip_llm, prompts=args.prompts, samples=args.samples,
        tokens=args.tokens, gamma=args.gamma, mc_runs=args.mc_runs, engine_runs=args.engine_runs,
        llm_budget=None if args.llm_minutes is None else 60.0 * args.llm_minutes, threads=args.threads,
        forms=args.forms, prompt_set=args.prompt_set, target_precision=args.target_precision, table_eps=eps,
        prompt_offset=args.prompt_offset)


def run(args) -> int:
    """Entry point of ``specbound reproduce yin``: settings, output directory and journal; the study
    (:func:`specbound.experiments.yin_study.run`); figures, summary.md and results.json; a short summary."""
    from rich.console import Console

    from ...measure.journal import PARTIAL_NAME, PartialResults
    from ...experiments.report import check_output_dir, progress_bar, to_jsonable
    from ...experiments.yin_report import write_figures, write_results
    from ...experiments.yin_study import run as run_study

    s = settings_from_args(args)
    out_dir = check_output_dir(s.out)
    journal = None
    if not s.skip_llm:
        fingerprint = {"study": "reproduce yin table 1", "settings": to_jsonable(s)}
        # none of these changes what a unit measures
        for volatile in ("out", "llm_budget", "quick_total_seconds", "bootstrap"):
            fingerprint["settings"].pop(volatile, None)
        journal = PartialResults(Path(out_dir) / PARTIAL_NAME, fingerprint, resume=args.resume)
    console = Console(stderr=True)
    command = ("specbound reproduce yin " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["reproduce", "yin"]
               else "specbound reproduce yin")
    start = time.perf_counter()
    with progress_bar(not args.no_progress, console=console) as progress:
        result = run_study(s, progress, journal, command=command)
    t = time.perf_counter()
    result.files = write_figures(out_dir, result) + ["summary.md", "results.json"]
    result.runtime_seconds["figures"] = time.perf_counter() - t
    result.runtime_seconds["total"] = time.perf_counter() - start
    write_results(result, out_dir)
    if journal is not None:
        journal.discard()
    f2, f4, t1 = result.fig2, result.fig4, result.table1
    sd = f2.rows["sd"]
    console.print(f"[bold]Fig. 2[/bold]: exact E[N_rej] = {sd.exact:.4f} (speed-up {s.horizon / sd.exact:.3f}); "
                  f"NumPy MC {sd.numpy_mc.mean:.3f} ± {sd.numpy_mc.se:.3f}; paper 16.41 / 3.05 (own chain)")
    console.print(f"[bold]Fig. 4[/bold]: TV = {f4.tv:.4f}; max |rej + bias − TV| = "
                  f"{max(d.identity_max_abs_error for d in f4.forms.values()):.1e}")
    console.print(f"[bold]Table 1[/bold]: {t1.status}" + (f" — {t1.note}" if t1.note else ""))
    console.print(f"Wrote {out_dir}/summary.md, results.json and {len(result.files) - 2} figures in "
                  f"{result.runtime_seconds['total']:.1f} s")
    return 0
