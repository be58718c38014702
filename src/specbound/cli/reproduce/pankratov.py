"""`specbound reproduce pankratov [--quick] [--skip-llm] [--resume] [--augment]`."""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import SpecboundError
from ..arguments import positive_threads

HELP = "Pankratov & Alistarh 2026: moments table and Fig. 2 in kind"

DEFAULT_OUT = "runs/reproduce-pankratov"


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="small numbers; finishes in < 2 minutes")
    parser.add_argument("--skip-llm", action="store_true", help="only the synthetic i.i.d. checks (no models)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice; 1 is far faster on a shared CPU)")
    parser.add_argument("--target-precision", choices=("kquant", "int8", "fp32"), default="kquant",
                        help="the target measured: kquant (default; the packaged GGUF's Q4_K/Q6_K weights, what "
                             "`generate` runs), int8 (per-channel int8 on torch) or fp32")
    parser.add_argument("--augment", action="store_true",
                        help="add exact per-position drafter values to an earlier run in --out and re-render")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run in --out from its partial results (same options)")


def run(args) -> int:
    """Entry point of ``specbound reproduce pankratov``: options, output directory and journal; the study
    (:func:`specbound.experiments.pankratov.run`, or :func:`~specbound.experiments.pankratov.augment` of a
    finished run); the report; the exit code (1 when a synthetic check fails)."""
    from ...measure.journal import PARTIAL_NAME, PartialResults
    from ...experiments.pankratov import PankratovResult, Settings, augment
    from ...experiments.pankratov import run as run_study
    from ...experiments.pankratov_report import render
    from ...experiments.report import check_output_dir, from_jsonable, to_jsonable

    positive_threads(args)
    if args.augment and args.resume:
        raise SpecboundError("--augment re-renders a finished run; it cannot be combined with --resume")
    out = check_output_dir(args.out)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    progress = not args.no_progress
    if args.augment:
        path = out / "results.json"
        if not path.is_file():
            raise SpecboundError(f"--augment needs a finished run: {path} does not exist")
        result = from_jsonable(PankratovResult, json.loads(path.read_text()), str(path))
        result = augment(result, progress=progress)
        render(result, out)
        return _exit_code(result)
    settings = Settings(quick=args.quick, skip_llm=args.skip_llm, target_precision=args.target_precision)
    journal = None
    if not settings.skip_llm:
        cfg, _ = settings.llm_config()
        journal = PartialResults(Path(out) / PARTIAL_NAME, {"study": "reproduce pankratov", "config": to_jsonable(cfg),
                                                            "set_sizes": to_jsonable(settings.set_sizes()),
                                                            "target_precision": settings.target_precision},
                                 resume=args.resume)
    result = run_study(settings, progress, journal)
    if result.llm is None:
        print(f"NOTE: LLM parts skipped: {result.llm_note}")
    render(result, out)
    if journal is not None:
        journal.discard()
    return _exit_code(result)


def _exit_code(result) -> int:
    return 0 if result.synthetic.all_within_tolerance and result.synthetic.all_bounds_hold else 1
