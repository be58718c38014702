"""`specbound generate`: speculative decoding on real models; streams the text, then prints the metrics."""
from __future__ import annotations

import json
import sys

from ..errors import SpecboundError
from ..options import DEFAULT_DRAFT_ENGINE, DRAFT_ENGINES, TARGET_PRECISIONS
from . import output
from .arguments import TARGET_PRECISION_HELP, add_compile, add_draft_quant

HELP = "speculative decoding on real models; streams text and prints metrics"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_request_arguments(p)


def add_model_arguments(p) -> None:
    """The models, drafting and threads: what `serve` takes from generate as they are."""
    p.add_argument("--target", default=None, help="packaged model name or local directory (default: Qwen2.5-Coder-1.5B)")
    p.add_argument("--draft", default=None,
                   help="packaged model name or local directory (default: Qwen2.5-Coder-0.5B), or 'none': draft "
                        "only from the context (tokens found earlier in the prompt and output), no draft model")
    p.add_argument("--gamma", default=None,
                   help="draft chain length K, 'auto' (cost-model choice per round; the default) or 'horizon'")
    p.add_argument("--tree", type=int, default=None, metavar="P",
                   help="draft a tree of at most P nodes per round instead of a chain (Pankratov & Alistarh)")
    p.add_argument("--tree-drafter", default="dynamic", choices=["dynamic", "sampled", "chain", "oracle"],
                   help="with --tree: how the tree is drafted (default dynamic: top-P by draft path probability)")
    p.add_argument("--drafts", type=int, default=None, metavar="M",
                   help="batch SD: M i.i.d. draft sequences per round (Yin et al. Alg. 4)")
    p.add_argument("--design", default="B", choices=["A", "B"], help="with --drafts: batch verification design")
    p.add_argument("--shape", default="fixed", choices=["fixed", "auto"],
                   help="auto: every round drafts the shape predicted fastest from the run so far: a chain "
                        "(γ = auto), 2 drafts or a sampled tree (T > 0; at T = 0 the chain); fixed (default): "
                        "what --gamma / --tree / --drafts say")
    p.add_argument("--context", default=None, choices=["auto", "off"],
                   help="auto (the default with γ = auto): a round drafts the continuation found earlier in the "
                        "context instead of reading the draft model where that is predicted faster; off: never")
    p.add_argument("--relaxation", default=None, metavar="NAME:EPS[:FORM]",
                   help="biased over-acceptance decoding, e.g. opt:0.1 or uno:0.1:ratio (Yin et al. §5; NOT lossless)")
    p.add_argument("--verification", default="auto", choices=["auto", "token", "block"],
                   help="how a sampled draft chain is verified: jointly (block verification, Sun et al. 2025: "
                        "same output law, never fewer accepted tokens in expectation) or token-wise (Yin et al. "
                        "Alg. 1); auto (the default) = block for a drafted chain, token-wise for trees, "
                        "--drafts and --relaxation; greedy decoding is the same under both")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: the cores available to this process)")
    p.add_argument("--target-precision", default=None, choices=list(TARGET_PRECISIONS),
                   help=TARGET_PRECISION_HELP)
    p.add_argument("--draft-engine", default=DEFAULT_DRAFT_ENGINE, choices=list(DRAFT_ENGINES),
                   help="where the draft runs: torch (int8), llamacpp (the draft's GGUF file, needs "
                        "specbound[llamacpp]) or auto (llamacpp when installed, else torch; the default); "
                        "the target stays on torch")
    add_draft_quant(p)
    p.add_argument("--draft-head", default="full", metavar="full|K",
                   help="the llama.cpp draft's output layer: full (default), or only its K most frequent tokens "
                        "(counted over Python's standard library; cheaper drafted tokens, the output unchanged)")
    add_compile(p)
    p.add_argument("--eager", action="store_true", help="keep eager linear layers (no oneDNN prepacking)")
    p.add_argument("--draft-fp32", action="store_true",
                   help="keep the draft in fp32 (default: int8 weights, ~3x cheaper per drafted token, "
                        "slightly lower acceptance; the output law is unaffected)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")


def add_request_arguments(p) -> None:
    """The prompts, sampling, budget and report of one run (a server takes these with each request)."""
    p.add_argument("--prompt", default=None, help="prompt text (default: a prompt from --prompt-set)")
    p.add_argument("--kind", default="code", choices=["code", "chat", "math"],
                   help="how to format --prompt: raw text (code) or chat template (chat, math)")
    p.add_argument("--prompt-set", default="humaneval", help="humaneval | mtbench | gsm8k | builtin")
    p.add_argument("--index", default=None,
                   help="prompt index in the set (default 2, HumanEval/2); several (3,7,9) decode them together "
                        "as one batch")
    p.add_argument("--prompt-file", default=None, metavar="FILE",
                   help="decode every prompt of FILE together as one batch: one prompt per line (a line holding "
                        "a JSON string is decoded, for prompts of several lines)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", action="store_true", help="also time plain target decoding and compare")
    p.add_argument("--quiet", action="store_true", help="no streamed text, metrics only")
    p.add_argument("--json", action="store_true", help="print a JSON report instead of text + table")


def check_text(text: str, what: str) -> str:
    """Refuse empty text and text that is not valid UTF-8 (undecodable bytes arrive as surrogates)."""
    if not text.strip():
        raise SpecboundError(f"{what} is empty: give some text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecboundError(f"{what} is not valid UTF-8 text") from None
    return text


def _indices(text) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise SpecboundError(f"--index must be an integer or a comma-separated list (3,7,9), got {text!r}") from None
    if not values or min(values) < 0:
        raise SpecboundError(f"--index must hold integers >= 0, got {text!r}")
    return values


def _read_prompt_file(path: str, kind: str):
    from pathlib import Path

    from ..assets.prompts import Prompt

    file = Path(path)
    if not file.is_file():
        raise SpecboundError(f"--prompt-file {path}: no such file")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecboundError(f"--prompt-file {path}: cannot read it as UTF-8 text ({exc})") from None
    prompts = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        text = line
        if line.lstrip().startswith('"'):
            try:
                text = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecboundError(f"--prompt-file {path}, line {n}: not a valid JSON string ({exc})") from None
        prompts.append(Prompt(id=f"{file.name}:{n}", text=check_text(str(text), f"--prompt-file line {n}"), kind=kind))
    if not prompts:
        raise SpecboundError(f"--prompt-file {path} holds no prompt")
    return prompts


def _pick_prompts(args) -> list:
    """The prompts to decode: --prompt text, --prompt-file, or prompts --index of --prompt-set (default
    HumanEval/2). Cheap: reads only the prompt file or set, so bad --prompt-set / --index / --prompt-file
    fail before any model loads. More than one prompt means one batch."""
    from ..assets.prompts import Prompt, load_prompts

    if args.prompt is not None and args.prompt_file is not None:
        raise SpecboundError("give --prompt or --prompt-file, not both")
    if args.prompt is not None:
        return [Prompt(id="cli", text=check_text(args.prompt, "--prompt"), kind=args.kind)]
    if args.prompt_file is not None:
        return _read_prompt_file(args.prompt_file, args.kind)
    indices = _indices(args.index)
    if indices is None:                    # HumanEval/2 by default; the first prompt of a fallback set
        prompts = load_prompts(args.prompt_set)
        return [prompts[2 if len(prompts) > 2 else 0]]
    out = []
    for index in indices:
        try:
            out.append(load_prompts(args.prompt_set, limit=1, offset=index)[0])
        except SpecboundError as exc:
            raise SpecboundError(f"--index {index}: {exc}") from None
    return out


def _gamma(text):
    if text is None or text == "auto":
        return text
    if text == "horizon":
        return None
    try:
        value = int(text)
    except ValueError:
        raise SpecboundError(f"--gamma must be an integer >= 1, 'auto' or 'horizon', got {text!r}") from None
    if value < 1:
        raise SpecboundError(f"--gamma must be an integer >= 1, 'auto' or 'horizon', got {value}")
    return value


def draft_spec_from_args(args):
    """The drafting options as a validated :class:`~specbound.decoding.DraftSpec` (no model needed).

    Default γ: "auto" for a chain, 4 for batch drafts (which need a fixed length), none for trees.
    """
    from ..decoding import DraftSpec

    gamma = _gamma(args.gamma)
    if args.gamma is None and args.tree is None:
        gamma = "auto" if (args.drafts or 1) == 1 else 4
    if args.draft == "none" and (args.tree is not None or args.drafts or args.shape == "auto" or gamma != "auto"):
        raise SpecboundError("--draft none drafts from the context, sized every round: give no --gamma, --tree, "
                             "--drafts or --shape auto")
    context = getattr(args, "context", None)
    if context is None:
        single = args.tree is None and (args.drafts or 1) == 1 and args.shape != "auto"
        context = "auto" if gamma == "auto" and single and args.relaxation is None else "off"
    return DraftSpec(gamma=gamma, context=context, tree=args.tree,
                     tree_drafter=args.tree_drafter, drafts=args.drafts,
                     design=args.design, relaxation=args.relaxation, verification=args.verification,
                     shape=args.shape)


def run(args) -> int:
    from ..decoding import SamplingConfig
    from ..models.tokens import stop_token_ids
    from ..options import resolve_compile

    console = output.console(stderr=True, quiet=args.json)
    # every cheap argument first: nothing below loads a model before these pass
    SamplingConfig(args.temperature, args.top_k, args.top_p)
    spec = draft_spec_from_args(args)
    if args.max_new_tokens < 1:
        raise SpecboundError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.target_precision is not None:
        resolve_compile(args.compile, args.target_precision)
    prompts = _pick_prompts(args)
    if len(prompts) > 1 and spec.shape == "auto":
        raise SpecboundError("--shape auto decodes one prompt (a batch's requests share one chain length per "
                             "round): give one --index, or drop --shape auto")
    target, draft, plain = load_models(args, console)
    stops = () if args.ignore_eos else stop_token_ids(target)
    if len(prompts) > 1:
        return _run_batch(args, target, draft, prompts, spec, stops, console, plain)
    return _run_one(args, target, draft, prompts[0], spec, stops, console, plain)


def load_models(args, console) -> tuple:
    """(target, draft or None, plain): the draft engine and head checked, the target chosen by measurement
    (``choose_target``), then the models loaded once — what generate and serve decode with."""
    from ..models.trimmed import check_draft_head
    from ..options import resolve_compile, resolve_draft_engine
    from ..runtime import configure_threads
    from .arguments import choose_target

    args.draft_engine = resolve_draft_engine(args.draft_engine)
    check_draft_head(args.draft_head)
    if args.draft_head != "full" and (args.draft_engine != "llamacpp" or args.draft == "none"):
        raise SpecboundError("--draft-head trims a llama.cpp draft's output layer: it needs --draft-engine llamacpp "
                             "and a draft model")
    if args.draft_engine == "llamacpp":
        from ..models.llamacpp import load_llama_cpp

        load_llama_cpp()                   # not installed: say so before any model loads
    configure_threads(args.threads)
    deployment, measured = choose_target(args, console)
    args.compile = resolve_compile(args.compile, args.target_precision)
    if deployment is not None and deployment.plain_llamacpp:
        target = measured.pop("llamacpp")
        measured.clear()                   # the measured torch target and draft are not needed
        return target, None, True
    if args.draft == "none":               # the context drafts: the target alone
        target = measured.pop(args.target_precision, None) or load_target_from_args(args, console)
        measured.clear()
        return target, None, False
    return (*load_pair_from_args(args, measured, console), False)


def load_target_from_args(args, console):
    """The target alone (``--draft none``: the context drafts)."""
    from ..models.loading import DEFAULT_TARGET, load_model

    with console.status("loading the target (first use converts the packaged weights)…"):
        return load_model(args.target or DEFAULT_TARGET, prepack=not args.eager, precision=args.target_precision,
                          compiled=args.compile)


def load_pair_from_args(args, measured: dict, console):
    """The pair to decode with: the models the target choice measured (when it loaded the chosen target
    and the draft this run asks for), else loaded now."""
    from ..models.loading import check_same_tokenizer, load_pair

    if args.target_precision in measured and "draft" in measured and args.draft_fp32 is False \
            and args.draft_head == "full":
        target, draft = measured.pop(args.target_precision), measured.pop("draft")
        measured.clear()
        check_same_tokenizer(target, draft)
        return target, draft
    measured.clear()
    with console.status("loading models (first use converts the packaged weights, a few minutes)…"):
        return load_pair(args.target, args.draft, prepack=not args.eager, draft_int8=not args.draft_fp32,
                         target_precision=args.target_precision, draft_engine=args.draft_engine,
                         draft_quant=args.draft_quant, compiled=args.compile, draft_head=args.draft_head)


def _run_one(args, target, draft, prompt, spec, stops, console, plain: bool) -> int:
    """One prompt, streamed: speculative decoding (``speculative_decode``; ``draft`` None: from the context),
    or plain decoding where the target choice found that nothing speculative beats plain llama.cpp here."""
    from ..assets.prompts import format_prompt
    from ..decoding import DecodeInterrupted, autoregressive_decode, speculative_decode

    text = format_prompt(target.tokenizer, prompt)
    ids = target.tokenizer(text, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise SpecboundError("the prompt tokenizes to nothing")
    tokenizer = target.tokenizer
    generated: list[int] = []
    shown = [0]

    def stream(new_ids):
        generated.extend(new_ids)
        if args.json or args.quiet:
            return
        full = tokenizer.decode(generated, skip_special_tokens=True)
        sys.stdout.write(full[shown[0]:])
        sys.stdout.flush()
        shown[0] = len(full)

    if not (args.json or args.quiet):
        sys.stdout.write(text if prompt.kind == "code" else f"[{prompt.kind} prompt {prompt.id}]\n")
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    stop_token_ids=stops)
    status = 0
    try:
        if plain:
            result = autoregressive_decode(target, ids, args.max_new_tokens, callback=stream, **sampling)
        else:
            result = speculative_decode(target, draft, ids, args.max_new_tokens, gamma=spec.gamma, tree=spec.tree,
                                        tree_drafter=spec.tree_drafter, drafts=spec.drafts, design=spec.design,
                                        relaxation=spec.relaxation, verification=spec.verification,
                                        shape=spec.shape, context=spec.context, callback=stream, **sampling)
    except DecodeInterrupted as stop:
        result, status = stop.result, 130
        console.print("\n[bold]interrupted[/bold]: metrics of the tokens generated so far")
    if not (args.json or args.quiet):
        sys.stdout.write("\n")
    baseline = None
    if args.baseline and status == 0:
        with console.status("plain target decoding for comparison…"):
            baseline = autoregressive_decode(target, ids, result.metrics.new_tokens, temperature=args.temperature,
                                             top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    report = _report(result, baseline, target, draft, prompt, _perfect_draft(result.costs, result.metrics, draft))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, console)
    return status


def _run_batch(args, target, draft, prompts, spec, stops, console, plain: bool) -> int:
    """Several prompts decoded together (``speculative_decode_batch``): a progress bar per request while
    they run, then each request's text and one table (per request and for the batch)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..assets.prompts import format_prompt
    from ..decoding import BatchInterrupted, autoregressive_decode_batch, speculative_decode_batch

    tokenizer = target.tokenizer
    ids = []
    for prompt in prompts:
        encoded = tokenizer(format_prompt(tokenizer, prompt), return_tensors="pt").input_ids[0].tolist()
        if not encoded:
            raise SpecboundError(f"prompt {prompt.id} tokenizes to nothing")
        ids.append(encoded)
    status = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as progress:
        tasks = [progress.add_task(p.id, total=args.max_new_tokens) for p in prompts]

        def advance(i, new_ids):
            progress.advance(tasks[i], len(new_ids))

        sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                        stop_token_ids=stops, callback=advance)
        try:
            if plain:
                batch = autoregressive_decode_batch(target, ids, args.max_new_tokens, **sampling)
            else:
                batch = speculative_decode_batch(
                    target, draft, ids, args.max_new_tokens, gamma=spec.gamma, tree=spec.tree,
                    tree_drafter=spec.tree_drafter, drafts=spec.drafts, design=spec.design, relaxation=spec.relaxation,
                    verification=spec.verification, **sampling)
        except BatchInterrupted as stop:
            batch, status = stop.result, 130
    baseline = None
    if args.baseline and status == 0:
        with console.status("plain batched decoding of the same prompts for comparison…"):
            baseline = autoregressive_decode_batch(target, ids, [r.metrics.new_tokens for r in batch],
                                                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                                   seed=args.seed)
    report = {**_model_names(target, draft), "batch": len(prompts),
              "interrupted": status != 0, "wall_time": batch.wall_time, "new_tokens": batch.new_tokens,
              "tokens_per_second": batch.tokens_per_second, "target_passes": batch.target_passes, "requests": []}
    for i, (prompt, r) in enumerate(zip(prompts, batch)):
        if r is None:
            continue
        m = r.metrics
        entry = {"prompt_id": prompt.id, "method": r.method, "sampling": r.sampling, "new_tokens": m.new_tokens,
                 "tau": m.tau, "latency": m.total_time, "text_tokens": r.tokens}
        if baseline is not None:
            entry["identical_to_plain"] = baseline[i].tokens == r.tokens
        report["requests"].append(entry)
    if baseline is not None:
        report["plain_tokens_per_second"] = baseline.tokens_per_second
        report["speedup_vs_plain_batch"] = batch.tokens_per_second / baseline.tokens_per_second
    if args.json:
        print(json.dumps(report, indent=2))
        return status
    if not args.quiet:
        for prompt, r in zip(prompts, batch):
            if r is not None:
                sys.stdout.write(f"\n=== {prompt.id} ===\n{format_prompt(tokenizer, prompt) if prompt.kind == 'code' else ''}"
                                 f"{tokenizer.decode(r.tokens, skip_special_tokens=True)}\n")
    _print_batch_report(report, console)
    return status


def _print_batch_report(r: dict, console) -> None:
    from rich.table import Table

    first = r["requests"][0] if r["requests"] else {"method": "-", "sampling": "-"}
    from rich.markup import escape

    table = Table(title=escape(f"batch of {r['batch']}, {first['method']}: {r['target']} [{r['target_kernels']}] ← "
                               f"{r['draft']} [{r['draft_kernels']}] ({first['sampling']})"))
    for column in ("request", "new tokens", "τ", "latency s") + (("= plain",) if "speedup_vs_plain_batch" in r else ()):
        table.add_column(column, justify="left" if column == "request" else "right")
    for q in r["requests"]:
        cells = [q["prompt_id"], str(q["new_tokens"]), f"{q['tau']:.2f}", f"{q['latency']:.2f}"]
        if "identical_to_plain" in q:
            cells.append("yes" if q["identical_to_plain"] else "no")
        table.add_row(*cells)
    console.print(table)
    line = (f"batch: {r['new_tokens']} tokens in {r['wall_time']:.2f} s = {r['tokens_per_second']:.2f} tokens/s "
            f"({r['target_passes']} shared target passes)" + ("  (interrupted)" if r["interrupted"] else ""))
    if "speedup_vs_plain_batch" in r:
        line += (f"; plain batched decoding {r['plain_tokens_per_second']:.2f} tokens/s → "
                 f"{r['speedup_vs_plain_batch']:.2f}×")
    console.print(line)


def _perfect_draft(costs, metrics, draft) -> dict | None:
    """The most this draft's cost allows (every drafted token accepted), from the cost model the run's
    drafter sized its drafts with, each drafted token priced by its source (the run's share found in the
    context costs no draft read; with no draft model every one is); None for drafters of fixed shape
    (no calibration) and plain decoding."""
    from ..decoding.costs import perfect_draft_speedup

    if costs is None:
        return None
    share = 1.0 if draft is None else metrics.context_share
    gamma, speedup = perfect_draft_speedup(costs, context_share=share)
    return {"gamma": gamma, "speedup": speedup, "context_share": share}


def _context_text(r: dict) -> str:
    n, total = r.get("context_drafted", 0), sum(r["drafted_per_round"])
    if not n:
        return "none"
    return (f"{n} of {total} drafted tokens ({n / max(total, 1):.0%}), {r['context_accepted']} accepted "
            f"({r['context_accepted'] / n:.0%}); no draft read for them")


def _share_text(p: dict) -> str:
    share = p.get("context_share", 0.0)
    if share >= 1.0:
        return ", every token from the context at no draft cost"
    return f", {share:.0%} of drafted tokens from the context at no draft cost" if share > 0 else ""


def _model_names(target, draft, method: str = "") -> dict:
    """The pair and its kernels, as every report names them (no draft: plain decoding, or the context's)."""
    none = "none (drafts from the context)" if method == "context" else "none (plain decoding)"
    return {"target": target.name, "draft": draft.name if draft is not None else none,
            "target_kernels": f"{target.info.backend}:{target.info.kernels}",
            "draft_kernels": f"{draft.info.backend}:{draft.info.kernels}" if draft is not None else "-"}


def _report(result, baseline, target, draft, prompt, perfect_draft: dict | None = None) -> dict:
    m = result.metrics
    out = {**_model_names(target, draft, result.method),
           "method": result.method, "prompt_id": prompt.id,
           "sampling": result.sampling, "lossless": result.lossless, "interrupted": m.interrupted,
           "new_tokens": m.new_tokens, "tau": m.tau, "target_calls": m.target_calls, "rejections": m.rejections,
           "plain_steps": m.plain_steps, "acceptance_per_position": m.acceptance_per_position,
           "tokens_per_second": m.tokens_per_second, "decode_tokens_per_second": m.decode_tokens_per_second,
           "draft_time": m.draft_time, "target_time": m.target_time, "verify_time": m.verify_time,
           "prefill_time": m.prefill_time, "calibration_time": m.calibration_time, "total_time": m.total_time,
           "drafted_per_round": m.drafted_per_step, "depth_per_round": m.depth_per_step,
           "expected_bias": m.expected_bias, "context_drafted": m.context_drafted,
           "context_accepted": m.context_accepted, "text_tokens": result.tokens}
    if perfect_draft is not None:
        out["perfect_draft"] = perfect_draft
    if baseline is not None:
        b = baseline.metrics
        out["baseline"] = {"tokens_per_second": b.tokens_per_second, "decode_tokens_per_second": b.decode_tokens_per_second,
                           "total_time": b.total_time, "prefill_time": b.prefill_time,
                           "identical_tokens": baseline.tokens == result.tokens}
        out["speedup_vs_target"] = m.decode_tokens_per_second / b.decode_tokens_per_second
        out["speedup_end_to_end"] = m.tokens_per_second / b.tokens_per_second
    return out


def _print_report(r: dict, console) -> None:
    from rich.table import Table

    from rich.markup import escape

    table = Table(title=escape(f"{r['method']}: {r['target']} [{r['target_kernels']}] ← {r['draft']} "
                               f"[{r['draft_kernels']}] ({r['sampling']})"), show_header=False)
    table.add_column(style="bold")
    table.add_column()
    acc = ", ".join(f"{a:.2f}" for a in r["acceptance_per_position"][:12] if a == a)
    drafted, depth = r["drafted_per_round"], r["depth_per_round"]
    rounds = max(len(drafted), 1)
    rows = [
        ("new tokens", str(r["new_tokens"]) + ("  (interrupted)" if r["interrupted"] else "")),
        ("τ (tokens per target call)", f"{r['tau']:.2f}  ({r['target_calls']} target calls, {r['rejections']} rejections)"),
        ("acceptance per draft depth", acc or "-"),
        ("drafted per round", f"mean {sum(drafted) / rounds:.2f} tokens, depth {sum(depth) / rounds:.2f}, "
                              f"plain steps {r['plain_steps']}"),
        ("drafted from the context", _context_text(r)),
        ("tokens/s: decoding / end to end", f"{r['decode_tokens_per_second']:.2f} / {r['tokens_per_second']:.2f}"
                                            "  (end to end = prefill + decoding)"),
        ("time: prefill / draft / target / verify", f"{r['prefill_time']:.2f} / {r['draft_time']:.2f} / "
                                                    f"{r['target_time']:.2f} / {r['verify_time']:.2f} s"),
    ]
    if r["calibration_time"] > 0:
        rows.append(("one-time cost calibration", f"{r['calibration_time']:.2f} s (cached for this pair: later runs "
                                                  "skip it; not in the figures above)"))
    if not r["lossless"]:
        rows.append(("expected TV bias (sum over positions)", f"{r['expected_bias']:.4f}  (biased on purpose)"))
    if "baseline" in r:
        b = r["baseline"]
        rows.append(("plain decoding of the same target",
                     f"{b['decode_tokens_per_second']:.2f} / {b['tokens_per_second']:.2f} tokens/s (decoding / end to "
                     f"end) → speed-up {r['speedup_vs_target']:.2f}× decoding, {r['speedup_end_to_end']:.2f}× end to "
                     f"end; identical tokens: {b['identical_tokens']}"))
    if "perfect_draft" in r:
        p = r["perfect_draft"]
        rows.append(("most a draft of this cost could give",
                     f"{p['speedup']:.2f}× plain decoding (a draft never wrong: chain γ = {p['gamma']}, this "
                     f"run's t(k) and d(1){_share_text(p)})" if p["gamma"] else
                     "nothing: even a draft that is never wrong would not beat plain decoding at this cost"))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
