"""`specbound bench`: speed against the strongest peers (held-out prompts), or --verify-cost."""
from __future__ import annotations

import contextlib
import sys

from ..errors import SpecboundError
from .arguments import add_compile, add_draft_quant, at_least, int_list, name_list

HELP = ("specbound vs HF generate / assisted (fp32 and the same int8 draft) / prompt lookup, on held-out "
        "prompts, interleaved in one process")

DEFAULT_OUT = "runs/bench"


def add_arguments(p) -> None:
    from ..options import DEFAULT_DRAFT_ENGINE, DRAFT_ENGINES, TARGET_PRECISIONS
    from .arguments import TARGET_PRECISION_HELP
    from ..experiments.bench import BENCH_METHODS, DEFAULT_METHODS, MODES

    p.add_argument("--target", default=None, help="packaged model name or local directory (default: Qwen2.5-Coder-1.5B)")
    p.add_argument("--draft", default=None, help="packaged model name or local directory (default: Qwen2.5-Coder-0.5B)")
    p.add_argument("--prompt-set", default="humaneval", help="humaneval | mtbench | gsm8k")
    p.add_argument("--offset", type=int, default=10,
                   help="first prompt (default 10: skip the prompts used while developing, HumanEval/0-4)")
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--modes", default="greedy", help=f"comma list of {', '.join(MODES)} (sampled: T=1, top-k 50)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma list of " + ", ".join(BENCH_METHODS) + f" (default: {','.join(DEFAULT_METHODS)})")
    add_draft_quant(p)
    add_compile(p)
    p.add_argument("--target-precision", default=None, choices=list(TARGET_PRECISIONS),
                   help="the torch target every torch method uses (HF peers and specbound alike); " + TARGET_PRECISION_HELP)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1,
                   help="paired repeats per prompt (default 1): every method runs S times with the same seeds, and "
                        "the report gives ratios with standard errors and 95%% intervals. Seeds only matter when "
                        "sampling: greedy modes run once whatever S. With --batch: S repeats of the whole sweep "
                        "(greedy, methods rotated anew each time), each repeat's ratio to plain reported")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: the cores available)")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for the JSON and markdown reports")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out (same options)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--verify-cost", action="store_true",
                   help="instead: t(k)/t(1) of the target for k = 1..64, eager vs prepacked, with repeats and spread")
    p.add_argument("--repeats", type=int, default=5, help="repeats per k for --verify-cost (median and spread)")
    p.add_argument("--batch", default=None, type=int_list(minimum=1), metavar="B,B,…",
                   help="instead: batched requests at these batch sizes (e.g. 1,2,4,8): total tok/s and latency of "
                        "speculative decoding vs plain batched decoding on the same target, HF generate with a "
                        "padded batch, llama.cpp plain on the target's GGUF one request at a time and with B "
                        "sequences per pass, HF assisted generation (int8 torch draft) one request at a time; greedy, "
                        "--max-new-tokens each")
    p.add_argument("--gammas", default="auto,4",
                   help="with --batch: the draft lengths to run (comma list of integers and 'auto')")
    p.add_argument("--draft-engine", default=DEFAULT_DRAFT_ENGINE, choices=list(DRAFT_ENGINES),
                   help="with --batch: where the draft's rows run (torch int8, or its GGUF on llama.cpp: rows share "
                        "one pass either way; auto: llama.cpp when installed)")
    p.add_argument("--contention", action="store_true",
                   help="instead: slowdown of plain and speculative decoding beside one CPU hog, per OpenMP wait "
                        "policy (PASSIVE, ACTIVE) and torch threads (2, 1)")


def run(args) -> int:
    from ..assets.prompts import load_prompts
    from ..runtime import configure_threads
    from ..experiments.bench import BENCH_METHODS, COMPILED_METHODS, LLAMACPP_METHODS, MODES, BenchConfig
    from ..experiments.report import check_output_dir
    from ..options import resolve_compile

    at_least(args, 1, "n_prompts", "max_new_tokens", "repeats", "seeds")
    at_least(args, 0, "offset", "threads", "seed")
    modes = name_list(args.modes, MODES, "--modes")
    methods = name_list(args.methods, BENCH_METHODS, "--methods")
    from ..options import COMPILED_PRECISIONS, DEFAULT_TARGET_PRECISION
    from . import output
    from .arguments import choose_target

    given = args.target_precision or DEFAULT_TARGET_PRECISION       # the default is compiled where chosen
    if any(m in COMPILED_METHODS for m in methods) and given not in COMPILED_PRECISIONS:
        raise SpecboundError("the *-compiled methods read a quantised target through torch.compile: use "
                             f"--target-precision {' or '.join(COMPILED_PRECISIONS)} (got {given})")
    if args.target_precision is not None:
        resolve_compile(args.compile, args.target_precision)
    if any(m in LLAMACPP_METHODS for m in methods) and not (args.verify_cost or args.contention or args.batch):
        from ..models.llamacpp import load_llama_cpp

        load_llama_cpp()                    # not installed: the error names the install command, before loading
        # (--batch decodes the torch models; its llama.cpp peer row is added only where the binding is installed)
    out = check_output_dir(args.out)
    if sum(map(bool, (args.verify_cost, args.contention, args.batch))) > 1:
        raise SpecboundError("--verify-cost, --contention and --batch are separate benchmarks: pick one")
    if args.batch:
        _gammas(args.gammas)
    if not args.verify_cost:             # a bad set or offset fails here, before the target choice
        load_prompts(args.prompt_set, limit=1 if args.contention else args.n_prompts, offset=args.offset)
    configure_threads(args.threads)
    _, measured = choose_target(args, output.console(stderr=True))   # the default's target and why, in one line
    measured.clear()                       # each method loads its own models
    args.compile = resolve_compile(args.compile, args.target_precision)
    if args.batch:
        gammas = _gammas(args.gammas)
        prompts = load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset)
        configure_threads(args.threads)
        return _batched(args, gammas, prompts, out)
    if args.contention:
        load_prompts(args.prompt_set, limit=1, offset=args.offset)      # a bad set/offset fails here, cheaply
        return _contention(args, out)
    prompts = None if args.verify_cost else load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset)
    configure_threads(args.threads)
    if args.verify_cost:
        return _verify_cost(args, out)
    config = BenchConfig(prompt_set=args.prompt_set, offset=args.offset, n_prompts=len(prompts),
                         max_new_tokens=args.max_new_tokens, modes=modes, methods=methods, seed=args.seed,
                         seeds=args.seeds)
    return _bench(args, config, out)


def _gammas(text: str) -> tuple:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if part == "auto":
            out.append("auto")
            continue
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value < 1:
            raise SpecboundError(f"--gammas: each entry must be an integer >= 1 or 'auto', got {part!r}")
        out.append(value)
    if not out:
        raise SpecboundError("--gammas: give at least one draft length")
    return tuple(out)


def _batched(args, gammas, prompts, out) -> int:
    from rich.console import Console

    from ..experiments.batched import BatchedConfig, markdown, run
    from ..experiments.bench import PairSpec
    from ..options import resolve_draft_engine
    from ..experiments.report import to_jsonable, write_json, write_text

    console = Console(stderr=True)
    config = BatchedConfig(prompt_set=args.prompt_set, offset=args.offset, n_prompts=len(prompts),
                           tokens=args.max_new_tokens, batches=tuple(args.batch), gammas=gammas,
                           repeats=args.seeds)
    pair = PairSpec(args.target, args.draft, args.target_precision, args.draft_quant,
                    resolve_draft_engine(args.draft_engine), compiled=args.compile)
    status = console.status("loading models (first use converts the packaged weights, a few minutes)…")
    with status:
        result = run(config, pair, progress=lambda text: status.update(f"batched requests: {text}"),
                     loading=lambda: _step(status, "batched requests…"))
    text = markdown(result, "specbound bench " + " ".join(sys.argv[2:]))
    stem = f"batched-{args.prompt_set}"
    write_json(to_jsonable(result), out / f"{stem}.json")
    write_text(out / f"{stem}.md", text)
    print(text)
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _step(status, after: str):
    """The status line stays as it is during the step, then says ``after``."""
    yield
    status.update(after)


def _verify_cost(args, out) -> int:
    import time

    from ..experiments.report import write_json
    from ..experiments.verify_cost import markdown, run_verify_cost

    report = run_verify_cost(args.target, repeats=args.repeats)
    path = write_json(report, out / f"verify-cost-{time.strftime('%Y%m%d-%H%M%S')}.json")
    print(markdown(report))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _contention(args, out) -> int:
    from rich.console import Console

    from ..experiments.contention import markdown, run_contention
    from ..experiments.report import to_jsonable, write_json, write_text

    console = Console(stderr=True)
    with console.status("contention benchmark…") as status:
        result = run_contention(args.target, args.draft, args.prompt_set, args.offset,
                                repeats=max(2, min(args.repeats, 3)),
                                progress=lambda text: status.update(f"contention benchmark: {text}"))
    text = markdown(result, "specbound bench " + " ".join(sys.argv[2:]))
    write_json(to_jsonable(result), out / "contention.json")
    write_text(out / "contention.md", text)
    print(text)
    print(f"wrote {out / 'contention.json'} and {out / 'contention.md'}", file=sys.stderr)
    return 0


def _bench(args, config, out) -> int:
    from rich.console import Console

    from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
    from ..experiments.bench import PairSpec, run
    from ..experiments.bench_report import bench_markdown
    from ..measure.journal import PARTIAL_NAME, PartialResults
    from ..experiments.report import to_jsonable, write_json, write_text

    console = Console(stderr=True)
    fingerprint = to_jsonable(config)
    if config.seeds == 1:
        fingerprint.pop("seeds", None)      # a one-seed run's units do not depend on --seeds
    pair = PairSpec(args.target, args.draft, args.target_precision, args.draft_quant,   # its methods name their draft
                    compiled=args.compile)
    journal = PartialResults(out / PARTIAL_NAME, {"bench": fingerprint, "target": pair.target or DEFAULT_TARGET,
                                                  "target_precision": pair.target_precision,
                                                  "draft": pair.draft or DEFAULT_DRAFT,
                                                  "draft_quant": pair.draft_quant,
                                                  **({"compiled": True} if pair.compiled else {})}, resume=args.resume)
    result = run(config, pair, journal, progress=not args.no_progress,
                 loading=lambda: console.status("loading models (first use converts the packaged weights, a few "
                                                "minutes)…"))
    command = "specbound bench " + " ".join(sys.argv[2:])
    stem = f"bench-{config.prompt_set}-{'-'.join(config.modes)}"
    write_json(to_jsonable(result), out / f"{stem}.json")
    text = bench_markdown(result, command)
    write_text(out / f"{stem}.md", text)
    journal.discard()
    print(text)
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}", file=sys.stderr)
    return 0
