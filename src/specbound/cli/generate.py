"""`specbound generate`: speculative decoding on real models; streams the text, then prints the metrics."""
from __future__ import annotations

import json
import sys

from ..errors import SpecboundError
from ..options import DEFAULT_DRAFT_ENGINE, DEFAULT_TARGET_PRECISION, DRAFT_ENGINES, TARGET_PRECISIONS

HELP = "speculative decoding on real models; streams text and prints metrics"


def add_arguments(p) -> None:
    p.add_argument("--target", default=None, help="packaged model name or local directory (default: Qwen2.5-Coder-1.5B)")
    p.add_argument("--draft", default=None, help="packaged model name or local directory (default: Qwen2.5-Coder-0.5B)")
    p.add_argument("--prompt", default=None, help="prompt text (default: a prompt from --prompt-set)")
    p.add_argument("--kind", default="code", choices=["code", "chat", "math"],
                   help="how to format --prompt: raw text (code) or chat template (chat, math)")
    p.add_argument("--prompt-set", default="humaneval", help="humaneval | mtbench | gsm8k | builtin")
    p.add_argument("--index", type=int, default=None, help="prompt index in the set (default 2, HumanEval/2)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", default=None,
                   help="draft chain length K, 'auto' (cost-model choice per round; the default) or 'horizon'")
    p.add_argument("--tree", type=int, default=None, metavar="P",
                   help="draft a tree of at most P nodes per round instead of a chain (Pankratov & Alistarh)")
    p.add_argument("--tree-drafter", default="dynamic", choices=["dynamic", "sampled", "chain", "oracle"],
                   help="with --tree: how the tree is drafted (default dynamic: top-P by draft path probability)")
    p.add_argument("--drafts", type=int, default=None, metavar="M",
                   help="batch SD: M i.i.d. draft sequences per round (Yin et al. Alg. 4)")
    p.add_argument("--design", default="B", choices=["A", "B"], help="with --drafts: batch verification design")
    p.add_argument("--relaxation", default=None, metavar="NAME:EPS[:FORM]",
                   help="biased over-acceptance decoding, e.g. opt:0.1 or uno:0.1:ratio (Yin et al. §5; NOT lossless)")
    p.add_argument("--verification", default="token", choices=["token", "block"],
                   help="how a sampled draft chain is verified: token-wise (default) or jointly (block "
                        "verification, Sun et al. 2025: same output law, never fewer accepted tokens)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: the cores available to this process)")
    p.add_argument("--target-precision", default=DEFAULT_TARGET_PRECISION, choices=list(TARGET_PRECISIONS),
                   help=f"the target you run (default {DEFAULT_TARGET_PRECISION}): int8 = int8 weights and activations "
                        "(~3x cheaper per pass, a slightly different model; decoding is lossless with respect to "
                        "it), fp32 = the packaged weights dequantised to float32")
    p.add_argument("--draft-engine", default=DEFAULT_DRAFT_ENGINE, choices=list(DRAFT_ENGINES),
                   help="where the draft runs: torch (int8), llamacpp (the draft's GGUF file, needs "
                        "specbound[llamacpp]) or auto (llamacpp when installed, else torch; the default); "
                        "the target stays on torch")
    p.add_argument("--eager", action="store_true", help="keep eager linear layers (no oneDNN prepacking)")
    p.add_argument("--draft-fp32", action="store_true",
                   help="keep the draft in fp32 (default: int8 weights, ~3x cheaper per drafted token, "
                        "slightly lower acceptance; the output law is unaffected)")
    p.add_argument("--baseline", action="store_true", help="also time plain target decoding and compare")
    p.add_argument("--quiet", action="store_true", help="no streamed text, metrics only")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
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


def _pick_prompt(args):
    """The prompt to decode: --prompt text, else prompt --index of --prompt-set (default HumanEval/2).
    Cheap: reads only the prompt-set file, so bad --prompt-set / --index fail before any model loads."""
    from ..assets.prompts import Prompt, load_prompts

    if args.prompt is not None:
        return Prompt(id="cli", text=check_text(args.prompt, "--prompt"), kind=args.kind)
    if args.index is None:                 # HumanEval/2 by default; the first prompt of a fallback set
        prompts = load_prompts(args.prompt_set)
        return prompts[2 if len(prompts) > 2 else 0]
    try:
        return load_prompts(args.prompt_set, limit=1, offset=args.index)[0]
    except SpecboundError as exc:
        raise SpecboundError(f"--index {args.index}: {exc}") from None


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
    return DraftSpec(gamma=gamma, tree=args.tree, tree_drafter=args.tree_drafter, drafts=args.drafts,
                     design=args.design, relaxation=args.relaxation, verification=args.verification)


def run(args) -> int:
    from rich.console import Console

    from ..assets.prompts import format_prompt
    from ..decoding import DecodeInterrupted, SamplingConfig, Speculator, autoregressive_decode, make_generator
    from ..models.loading import load_pair
    from ..options import check_precision, resolve_draft_engine
    from ..models.tokens import stop_token_ids
    from ..runtime import configure_threads

    console = Console(stderr=True, quiet=args.json)
    # every cheap argument first: nothing below loads a model before these pass
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    spec = draft_spec_from_args(args)
    if args.max_new_tokens < 1:
        raise SpecboundError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompt = _pick_prompt(args)
    check_precision(args.target_precision)
    args.draft_engine = resolve_draft_engine(args.draft_engine)
    if args.draft_engine == "llamacpp":
        from ..models.llamacpp import load_llama_cpp

        load_llama_cpp()                   # not installed: say so before any model loads
    configure_threads(args.threads)
    with console.status("loading models (first use converts the packaged weights, a few minutes)…"):
        target, draft = load_pair(args.target, args.draft, prepack=not args.eager, draft_int8=not args.draft_fp32,
                                  target_precision=args.target_precision, draft_engine=args.draft_engine)
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
    engine = Speculator(target, spec.build(target, draft, sampling), sampling, spec.rule,
                        () if args.ignore_eos else stop_token_ids(target), make_generator(args.seed))
    status = 0
    try:
        result = engine.run(ids, args.max_new_tokens, callback=stream)
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
    report = _report(result, baseline, target, draft, prompt)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, console)
    return status


def _report(result, baseline, target, draft, prompt) -> dict:
    m = result.metrics
    out = {"target": target.name, "draft": draft.name,
           "target_kernels": f"{target.info.backend}:{target.info.kernels}",
           "draft_kernels": f"{draft.info.backend}:{draft.info.kernels}",
           "method": result.method, "prompt_id": prompt.id,
           "sampling": result.sampling, "lossless": result.lossless, "interrupted": m.interrupted,
           "new_tokens": m.new_tokens, "tau": m.tau, "target_calls": m.target_calls, "rejections": m.rejections,
           "plain_steps": m.plain_steps, "acceptance_per_position": m.acceptance_per_position,
           "tokens_per_second": m.tokens_per_second, "decode_tokens_per_second": m.decode_tokens_per_second,
           "draft_time": m.draft_time, "target_time": m.target_time, "verify_time": m.verify_time,
           "prefill_time": m.prefill_time, "calibration_time": m.calibration_time, "total_time": m.total_time,
           "drafted_per_round": m.drafted_per_step, "depth_per_round": m.depth_per_step,
           "expected_bias": m.expected_bias, "text_tokens": result.tokens}
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

    table = Table(title=f"{r['method']}: {r['target']} [{r['target_kernels']}] ← {r['draft']} [{r['draft_kernels']}] "
                        f"({r['sampling']})", show_header=False)
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
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
