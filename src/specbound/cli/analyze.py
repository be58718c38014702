"""`specbound analyze --prompts SET [...]`: measure on the real pair, then write the report."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .arguments import at_least, int_list, positive_threads

HELP = "measure mu, mu2, oracle E[X*](P), bounds and drafters on real models (Pankratov & Alistarh)"


def add_arguments(parser) -> None:
    parser.add_argument("--target", default=None, help="target model (packaged name or directory; default: "
                                                       "qwen2.5-coder-1.5b)")
    parser.add_argument("--draft", default=None, help="draft model (default: qwen2.5-coder-0.5b)")
    parser.add_argument("--draft-fp32", action="store_true", help="use the fp32 draft (default: int8, cheaper)")
    parser.add_argument("--prompts", required=True, help="prompt set: humaneval, mtbench, gsm8k or builtin")
    parser.add_argument("--n-prompts", type=int, default=None, help="prompts for the moments (default 6)")
    parser.add_argument("--capacities", type=int_list(minimum=1), default=None, help="capacities P (default 1,2,4,...,64)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0), default 1")
    parser.add_argument("--tokens", type=int, default=None, help="sampled tokens per prompt for the moments")
    parser.add_argument("--texts-per-prompt", type=int, default=None,
                        help="independent samples of every prompt (default 1; one unit for standard errors)")
    parser.add_argument("--oracle-positions", type=int, default=None, help="positions for exact T*(P) (default 10)")
    parser.add_argument("--drafter-prompts", type=int, default=None)
    parser.add_argument("--drafter-tokens", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output directory (default runs/analyze-<set>)")
    parser.add_argument("--quick", action="store_true", help="small numbers (smoke test)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice; 1 is far faster on a shared CPU)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run in --out from its partial results (same options)")


def config_from_args(args):
    """The validated :class:`~specbound.experiments.analyze.AnalyzeConfig` (SpecboundError on bad values)."""
    from ..experiments.analyze import AnalyzeConfig

    at_least(args, 1, "n_prompts", "tokens", "texts_per_prompt")
    at_least(args, 0, "oracle_positions", "drafter_prompts", "drafter_tokens", "seed")
    cfg = AnalyzeConfig.quick() if args.quick else AnalyzeConfig()
    updates = {key: getattr(args, key) for key in ("n_prompts", "tokens", "texts_per_prompt", "oracle_positions",
                                                   "drafter_prompts", "drafter_tokens")
               if getattr(args, key, None) is not None}
    if getattr(args, "capacities", None):
        updates["capacities"] = tuple(args.capacities)
        if cfg.oracle_sd_capacities is not None:
            keep = sorted(set(cfg.oracle_sd_capacities) & set(args.capacities))
            updates["oracle_sd_capacities"] = tuple(keep or [min(args.capacities), max(args.capacities)])
    updates["temperature"] = args.temperature
    updates["seed"] = args.seed
    return replace(cfg, **updates)


def run(args) -> int:
    """Options, output directory and journal; the study (:func:`specbound.experiments.analyze.run`); the report."""
    import torch

    from ..assets.prompts import load_prompts
    from ..experiments.analyze import Settings
    from ..experiments.analyze import run as run_study
    from ..experiments.analyze_report import write_report
    from ..measure.journal import PARTIAL_NAME, PartialResults
    from ..experiments.report import check_output_dir, to_jsonable
    from ..models.loading import DEFAULT_DRAFT, DEFAULT_TARGET

    positive_threads(args)
    cfg = config_from_args(args)
    load_prompts(args.prompts, cfg.n_prompts)          # an unknown or missing set fails here, before any output
    out = check_output_dir(args.out or f"runs/analyze-{args.prompts}")
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings(args.prompts, cfg, target=args.target or DEFAULT_TARGET, draft=args.draft or DEFAULT_DRAFT,
                        draft_int8=not args.draft_fp32)
    journal = PartialResults(Path(out) / PARTIAL_NAME,
                             {"study": "analyze", "set": settings.prompt_set, "target": settings.target,
                              "draft": settings.draft, "draft_int8": settings.draft_int8, "config": to_jsonable(cfg)},
                             resume=args.resume)
    result = run_study(settings, progress=not args.no_progress, journal=journal)
    paths = write_report(result, out)
    journal.discard()
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
