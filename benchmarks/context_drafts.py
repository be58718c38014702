"""Drafts that cost less: the context mixed into the model draft's chain, the context alone, and a draft whose
head keeps its K most frequent tokens, against plain decoding of the same target and plain llama.cpp on the
same Q4_K_M file — side by side in one process, on held-out prompts of five workloads.

Methods (each decodes the packaged target; the torch target is the K-quant kernel on this CPU's path):

- ``llamacpp``: llama.cpp's own loop (llama-cpp-python ``Llama.generate``) on the Q4_K_M file — what users run;
- ``plain``: plain decoding of the kquant target (the "never worse than plain" reference);
- ``chain``: γ = auto with the q4_0 llama.cpp draft, no context (``generate`` before the context option);
- ``chain+context``: the same with ``context="auto"`` (``generate``'s default now);
- ``chain+context+headK``: the same with the draft's head trimmed to K tokens (``--draft-head K``);
- ``context``: the context alone (``--draft none``: no draft model).

Greedy unless ``--temperature``; EOS ignored; decode tokens/s (prefill excluded); per prompt the median of
``--repeats`` repeats, the method order rotating per repeat; every greedy run is checked token for token
against the plain run. Prints a table and writes JSON + markdown under ``--out``.

    python benchmarks/context_drafts.py --out docs/results/context-drafts
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

#: (prompt set, offset): prompts never used while the context drafter and its policy were written
WORKLOADS = (("humaneval", 20), ("edit", 10), ("mtbench-turn2", 10), ("gsm8k", 20), ("mtbench", 20))


def load_models(head: int):
    from specbound.assets.gguf import gguf_path
    from specbound.assets.models import DEFAULT_TARGET
    from specbound.experiments.llamacpp_peers import open_llama
    from specbound.models.loading import load_pair

    target, draft = load_pair(target_precision="kquant", draft_engine="llamacpp", draft_quant="q4_0", progress=False)
    _, trimmed = (None, None) if head <= 0 else load_pair(target_precision="kquant", draft_engine="llamacpp",
                                                          draft_quant="q4_0", draft_head=head, progress=False)
    return target, draft, trimmed, open_llama(gguf_path(DEFAULT_TARGET, progress=False))


def decode(method: str, models: dict, ids, n: int, sampling, seed: int):
    """(tokens, decode tokens/s, τ or None) of one run."""
    from specbound.decoding import autoregressive_decode, speculative_decode
    from specbound.experiments.bench import run_method

    if method == "llamacpp":
        tokens, run = run_method("llamacpp-plain", {"target": models["target"], "llamacpp_target": models["llama"]},
                                 ids, n, sampling, seed)
        return tokens, run.decode_tokens_per_second, None
    kw = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=seed)
    if method == "plain":
        res = autoregressive_decode(models["target"], ids, n, **kw)
    elif method == "context":
        res = speculative_decode(models["target"], None, ids, n, gamma="auto", **kw)
    else:
        draft = models["trimmed"] if "head" in method else models["draft"]
        res = speculative_decode(models["target"], draft, ids, n, gamma="auto", verification="auto",
                                 context="auto" if "context" in method else "off", **kw)
    return res.tokens, res.metrics.decode_tokens_per_second, getattr(res.metrics, "tau", None)


def draft_d1(model, ids, repeats: int = 20) -> float:
    """Median seconds of one drafted token after the prompt (the draft's d(1))."""
    model.reset()
    model.forward(ids, keep_logits=1)
    base = model.cache_length
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        model.forward(ids[:, -1:], keep_logits=1)
        times.append(time.perf_counter() - t0)
        model.crop(base)
    model.reset()
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(f"{s}:{o}" for s, o in WORKLOADS),
                    help="comma-separated SET:OFFSET (default: %(default)s)")
    ap.add_argument("--n-prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--head", type=int, default=32768, help="K of the trimmed head (0: leave it out)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--methods", default=None, help="comma-separated subset of the methods")
    ap.add_argument("--out", default="docs/results/context-drafts")
    args = ap.parse_args(argv)

    from specbound.assets.prompts import format_prompt, load_prompts
    from specbound.decoding import SamplingConfig
    from specbound.models.kquant import kernel_path
    from specbound.runtime import configure_threads

    configure_threads(0)
    workloads = [(w.split(":")[0], int(w.split(":")[1])) for w in args.workloads.split(",")]
    methods = ["llamacpp", "plain", "chain", "chain+context"] + \
        ([f"chain+context+head{args.head}"] if args.head > 0 else []) + ["context"]
    if args.methods:
        methods = [m for m in methods if m in args.methods.split(",")] or methods
    target, draft, trimmed, llama = load_models(args.head)
    models = {"target": target, "draft": draft, "trimmed": trimmed, "llama": llama}
    sampling = SamplingConfig(args.temperature, args.top_k)
    tokenizer = target.tokenizer
    warm = tokenizer("def f(x):\n", return_tensors="pt").input_ids
    for method in methods:
        decode(method, models, warm, 8, sampling, 0)
    d1 = {"full": draft_d1(draft, warm)}
    if trimmed is not None:
        d1[f"head{args.head}"] = draft_d1(trimmed, warm)
    rows = []
    for set_name, offset in workloads:
        for prompt in load_prompts(set_name, limit=args.n_prompts, offset=offset):
            ids = tokenizer(format_prompt(tokenizer, prompt), return_tensors="pt").input_ids
            rates, taus, same = {m: [] for m in methods}, {m: [] for m in methods}, {m: True for m in methods}
            reference = None
            for r in range(args.repeats):
                order = methods[r % len(methods):] + methods[:r % len(methods)]
                for method in order:
                    tokens, rate, tau = decode(method, models, ids, args.max_new_tokens, sampling, 1000 + r)
                    rates[method].append(rate)
                    taus[method].append(tau)
                    if sampling.greedy and method != "llamacpp":
                        tokens = list(tokens)[-args.max_new_tokens:]
                        reference = tokens if reference is None else reference
                        same[method] &= tokens == reference
            med = {m: statistics.median(v) for m, v in rates.items()}
            row = {"set": set_name, "prompt": prompt.id, "tok_s": med, "runs": rates, "tau": taus,
                   "identical": same if sampling.greedy else None}
            rows.append(row)
            print(f"{prompt.id}: " + "  ".join(f"{m} {med[m]:.1f}" for m in methods), file=sys.stderr, flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "cores": os.cpu_count(), "path": kernel_path(),
              "methods": methods, "d1_ms": {k: v * 1e3 for k, v in d1.items()}, "temperature": args.temperature,
              "top_k": args.top_k, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "rows": rows,
              "command": "python benchmarks/context_drafts.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    text = report(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "greedy" if sampling.greedy else f"t{args.temperature:g}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(text)
    print(text)
    return 0


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def report(result: dict) -> str:
    methods = result["methods"]
    top_k = "" if result["top_k"] is None else f", top-k {result['top_k']}"
    lines = [f"# Context drafts and a trimmed head ({result['date']}, {result['cpu']}, {result['cores']} cores, "
             f"kernel path {result['path']})", "", f"`{result['command']}` — T = {result['temperature']:g}"
             f"{top_k}, "
             f"{result['max_new_tokens']} tokens, EOS ignored, decode tokens/s, median of {result['repeats']} "
             "repeats per prompt (order rotated per repeat). Draft d(1): "
             + ", ".join(f"{k} {v:.1f} ms" for k, v in result["d1_ms"].items()), "",
             "Ratio to plain llama.cpp, per workload: median (min–max over prompts); last column: each method's "
             "lowest ratio to plain decoding of the same kquant target.", "",
             "| method | " + " | ".join(sorted({r['set'] for r in result['rows']}, key=_order)) + " | min vs plain |",
             "|---|" + "---:|" * (len({r['set'] for r in result['rows']}) + 1)]
    sets = sorted({r["set"] for r in result["rows"]}, key=_order)
    for m in methods:
        cells = []
        for s in sets:
            ratios = [r["tok_s"][m] / r["tok_s"]["llamacpp"] for r in result["rows"] if r["set"] == s]
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})")
        floor = min(r["tok_s"][m] / r["tok_s"]["plain"] for r in result["rows"]) if "plain" in methods else float("nan")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {floor:.2f} |")
    lines += ["", "Per prompt, tokens/s (median):", "", "| prompt | " + " | ".join(methods) + " |",
              "|---|" + "---:|" * len(methods)]
    for r in result["rows"]:
        lines.append(f"| {r['prompt']} | " + " | ".join(f"{r['tok_s'][m]:.1f}" for m in methods) + " |")
    if result["rows"] and result["rows"][0]["identical"] is not None:
        bad = [(r["prompt"], m) for r in result["rows"] for m, ok in r["identical"].items() if not ok]
        lines += ["", "Greedy identity with plain decoding: " + ("every run" if not bad else f"DIFFERS: {bad}")]
    return "\n".join(lines) + "\n"


def _order(name: str) -> int:
    names = [s for s, _ in WORKLOADS]
    return names.index(name) if name in names else len(names)


if __name__ == "__main__":
    sys.exit(main())
