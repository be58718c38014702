"""`specbound advise`: the speed-of-light of a deployment and the settings that get closest."""
from __future__ import annotations

import sys

from .arguments import add_compile, add_draft_quant, at_least, int_list, name_list

HELP = ("how much speculation can give a pair on this engine and machine, the speed of light, the best "
        "settings (predicted, then measured), exports")

DEFAULT_OUT = "runs/advise"


def add_arguments(p) -> None:
    from ..options import DRAFT_ENGINES, TARGET_PRECISIONS
    from .arguments import TARGET_PRECISION_HELP

    p.add_argument("--target", default=None, help="packaged model name or local path (default: Qwen2.5-Coder-1.5B); "
                                                 "a .gguf file with --engine llamacpp")
    p.add_argument("--draft", default=None, help="packaged model name or local path (default: Qwen2.5-Coder-0.5B)")
    p.add_argument("--engine", default="torch", choices=["torch", "llamacpp"],
                   help="where to measure: PyTorch (the --target-precision target, int8 draft) or llama.cpp "
                        "(the GGUF files)")
    p.add_argument("--target-precision", default=None, choices=list(TARGET_PRECISIONS),
                   help="with --engine torch: " + TARGET_PRECISION_HELP)
    p.add_argument("--draft-engine", default="auto", choices=list(DRAFT_ENGINES),
                   help="with --engine torch: where the draft runs (torch int8, its GGUF on llama.cpp, or auto: "
                        "llama.cpp when installed)")
    add_draft_quant(p)
    add_compile(p)
    p.add_argument("--prompt-set", default="humaneval", help="humaneval | mtbench | gsm8k")
    p.add_argument("--offset", type=int, default=20, help="first calibration prompt (held-out checks use the next ones)")
    p.add_argument("--n-prompts", type=int, default=4, help="calibration prompts")
    p.add_argument("--tokens", type=int, default=48, help="tokens generated per calibration prompt")
    p.add_argument("--positions", type=int, default=24, help="positions for exact tree values and the oracle")
    p.add_argument("--repeats", type=int, default=3, help="repeats of every cost-curve point")
    p.add_argument("--modes", default="greedy,sampled", help="comma list of greedy, sampled (T = 1)")
    p.add_argument("--check-prompts", type=int, default=3,
                   help="held-out prompts on which predicted settings are run and measured (0 = skip)")
    p.add_argument("--check-tokens", type=int, default=64)
    p.add_argument("--check-runs", type=int, default=3,
                   help="runs per held-out prompt and setting, each paired with a plain run (T = 1: different "
                        "random streams; greedy: the same tokens, re-timed); with --batch also each checked batch's runs")
    p.add_argument("--batch", default=None, metavar="B,B,…", type=int_list(minimum=1),
                   help="batch sizes (e.g. 1,2,4,8): predicted (and, with --check-prompts, measured) total tokens/s "
                        "of plain batched decoding and of speculative decoding per B, the best γ per B and a "
                        "per-batch-size draft-length table for serving engines (--engine torch)")
    p.add_argument("--batch-context", type=int, default=None, metavar="TOKENS",
                   help="with --batch: the prompt length the batch sizes are priced at (a pass over B rows costs "
                        "more as their caches grow); the calibration prompts are cut or extended to it. Default: "
                        "the held-out check prompts' median length plus half the difference between --check-tokens "
                        "and --tokens (so the mean cached context matches theirs), or the calibration prompts as "
                        "they are without checks")
    p.add_argument("--threads", type=int, default=0, help="threads (default: the cores available)")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    from ..advise import MODES, AdviseConfig, check_engine
    from ..assets.prompts import load_prompts
    from ..runtime import configure_threads
    from ..experiments.report import check_output_dir

    check_engine(args.engine)
    at_least(args, 1, "n_prompts", "tokens", "positions", "repeats", "check_tokens", "check_runs")
    at_least(args, 0, "offset", "check_prompts", "threads")
    modes = name_list(args.modes, MODES, "--modes")
    from ..errors import SpecboundError

    if args.batch_context is not None and (args.batch is None or args.batch_context < 2):
        raise SpecboundError("--batch-context needs --batch" if args.batch is None
                             else f"--batch-context must be >= 2 tokens, got {args.batch_context}")
    from ..options import FALLBACK_TARGET_PRECISION, resolve_compile

    if args.compile and args.engine != "torch":
        raise SpecboundError("--compile reads the torch target through torch.compile: use --engine torch")
    if args.engine == "torch" and args.target_precision is not None:
        resolve_compile(args.compile, args.target_precision)
    batches = ()
    if args.batch is not None:
        batches = tuple(args.batch)
        if args.engine != "torch":
            raise SpecboundError("--batch needs --engine torch: it prices a target whose rows share one pass, and "
                                 "llama.cpp target rows run one after another (the draft may run on llama.cpp)")
    out = check_output_dir(args.out)
    calibration = load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset)
    check = load_prompts(args.prompt_set, limit=args.check_prompts, offset=args.offset + args.n_prompts) \
        if args.check_prompts else []
    from ..options import resolve_draft_engine

    args.draft_engine = resolve_draft_engine(args.draft_engine)
    _check_engine_available("llamacpp" if args.draft_engine == "llamacpp" else args.engine)
    configure_threads(args.threads)
    if args.engine == "torch":               # every cheap check above: now the target, timed once per machine
        from . import output
        from .arguments import choose_target

        _, measured = choose_target(args, output.console(stderr=True))   # the default's target and why
        measured.clear()
    elif args.target_precision is None:       # not used by --engine llamacpp (the GGUF files are read directly)
        args.target_precision = FALLBACK_TARGET_PRECISION
    args.compile = resolve_compile(args.compile, args.target_precision) if args.engine == "torch" else False
    config = AdviseConfig(engine=args.engine, prompt_set=args.prompt_set, offset=args.offset,
                          n_prompts=len(calibration), tokens=args.tokens, positions=args.positions,
                          repeats=args.repeats, modes=modes, batches=batches)
    return _advise(args, config, calibration, check, out)


def _batch_context(args, check_ids) -> int | None:
    """The prompt length ``advise --batch`` prices batch sizes at: ``--batch-context``, else the check
    prompts' median length + (check tokens − calibration tokens) / 2 — the calibration decodes ``--tokens``
    per request and the checks ``--check-tokens``, so their mean cached contexts then agree — else None.
    Only the held-out prompts' LENGTHS are used (a user knows them before decoding), never their text or
    outcome. Measured without it (int8, GSM8K, B = 4): calibration prompts of 63-124 tokens, checks of
    103-285; a 4-row pass cost 1.5 × t(4) in the checks against 1.14 at calibration, and plain B = 4
    measured 0.74 of its prediction."""
    import statistics

    if args.batch_context is not None:
        return int(args.batch_context)
    if not check_ids:
        return None
    return max(int(statistics.median(len(p) for p in check_ids)) + (args.check_tokens - args.tokens) // 2, 2)


def _check_engine_available(engine: str) -> None:
    import importlib.util

    from ..errors import ModelNotAvailable

    if engine == "llamacpp" and importlib.util.find_spec("llama_cpp") is None:
        raise ModelNotAvailable("--engine llamacpp needs llama-cpp-python: pip install 'specbound[llamacpp]' "
                                "(it compiles llama.cpp, about 10 minutes on 2 cores)")


def _advise(args, config, calibration, check, out) -> int:
    from rich.console import Console

    from ..advise import advise, batch_table, measure_batches, measure_settings, recommendation
    from dataclasses import replace

    from ..export import export_all, to_llamacpp_server
    from ..models.loading import load_engine_pair
    from ..experiments.advise_report import write_advice
    from ..measure.llm import encode_prompts
    from ..experiments.report import progress_bar

    console = Console(stderr=True)
    with console.status(f"loading the pair on {config.engine}…"):
        target, draft, paths = load_engine_pair(config.engine, args.target, args.draft,
                                                target_precision=args.target_precision, draft_engine=args.draft_engine,
                                                draft_quant=args.draft_quant, compiled=args.compile)
    ids = encode_prompts(target, calibration)
    check_ids = encode_prompts(target, check)
    if config.batches:
        config = replace(config, batch_context=_batch_context(args, check_ids))
    with progress_bar(not args.no_progress) as bar:
        advice = advise(target, draft, ids, config, progress=bar)
    if check:
        advice.measured_prompts = [p.id for p in check]
        measure_settings(target, draft, advice, check_ids, args.check_tokens,
                         runs=args.check_runs)
        if config.batches:
            measure_batches(target, draft, advice, check_ids, args.check_tokens,
                            runs=args.check_runs)
    rec = recommendation(advice, paths["target"], paths["draft"], mode=config.modes[0])
    exports = export_all(rec)
    if paths.get("target_gguf"):            # llama.cpp's server loads the GGUF files, not converted directories
        exports["llama.cpp"] = to_llamacpp_server(replace(
            rec, target=paths["target_gguf"], draft=paths["draft_gguf"] if rec.draft is not None else None))
    if config.batches:
        import json

        exports["draft length per batch size (vLLM / SGLang)"] = json.dumps(
            {"num_speculative_tokens_per_batch_size": {str(B): g for B, g in batch_table(advice, config.modes[0]).items()}},
            indent=1)
    command = "specbound advise " + " ".join(sys.argv[2:])
    written = write_advice(advice, exports, out, command)
    print((out / "advice.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written.values()), file=sys.stderr)
    return 0
