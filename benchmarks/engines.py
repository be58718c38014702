"""PyTorch vs llama.cpp, plain vs speculative, side by side in ONE process (greedy, EOS ignored).

Methods, each on the same held-out prompts (rotated order per prompt), the same packaged pair:

* ``llama.cpp plain``            — llama-cpp-python's own ``Llama.generate`` on the Q4_K_M target GGUF;
* ``llama.cpp prompt-lookup``    — the binding's ``LlamaPromptLookupDecoding`` (10 tokens, n-gram 2);
* ``llama.cpp + draft (hook)``   — the binding's ``draft_model=`` hook fed by the 0.5B GGUF (γ = 4);
* ``specbound on llama.cpp``     — specbound's engine (chain, γ sized per round) on both GGUFs;
* ``torch plain``                — the fp32 (oneDNN-prepacked) target, plain decoding;
* ``specbound on torch``         — specbound chain SD, fp32 target + int8 draft.

    .venv/bin/python benchmarks/engines.py [--prompt-set humaneval] [--offset 10] [--n-prompts 3] [--tokens 96]

Prints a markdown table and writes <out>/engines.json and <out>/engines.md (tok/s, ratio to llama.cpp
plain, tokens per target pass, identical-to-engine's-own-greedy flags).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-set", default="humaneval")
    parser.add_argument("--offset", type=int, default=10)
    parser.add_argument("--n-prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="docs/results")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)

    from specbound.assets.gguf import gguf_path
    from specbound.assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
    from specbound.assets.prompts import format_prompt, load_prompts
    from specbound.decoding import autoregressive_decode, speculative_decode
    from specbound.models.llamacpp import LlamaCppModel
    from specbound.experiments.llamacpp_peers import DraftModelProposer, llama_generate, open_llama
    from specbound.models.loading import load_model

    target_gguf, draft_gguf = gguf_path(DEFAULT_TARGET), gguf_path(DEFAULT_DRAFT)
    lc_target = LlamaCppModel(target_gguf, n_threads=args.threads, name="target.gguf")
    lc_draft = LlamaCppModel(draft_gguf, n_threads=args.threads, name="draft.gguf")
    llm = open_llama(target_gguf, n_threads=args.threads)
    import llama_cpp.llama_speculative as spec

    llm_lookup = open_llama(target_gguf, n_threads=args.threads,
                            draft_model=spec.LlamaPromptLookupDecoding(num_pred_tokens=10, max_ngram_size=2))
    hook_draft = LlamaCppModel(draft_gguf, n_threads=args.threads, name="hook-draft.gguf")
    llm_draft = open_llama(target_gguf, n_threads=args.threads, draft_model=DraftModelProposer(hook_draft, 4))
    torch_target = load_model(DEFAULT_TARGET, progress=False)
    torch_draft = load_model(DEFAULT_DRAFT, progress=False, prepack=False, int8=True)
    prompts = load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset)

    def run(method, ids):
        if method == "llama.cpp plain":
            r = llama_generate(llm, ids, args.tokens)
            return r.tokens, r.seconds, len(r.tokens) / max(r.target_evals, 1)
        if method == "llama.cpp prompt-lookup":
            r = llama_generate(llm_lookup, ids, args.tokens)
            return r.tokens, r.seconds, len(r.tokens) / max(r.target_evals, 1)
        if method == "llama.cpp + draft (hook)":
            r = llama_generate(llm_draft, ids, args.tokens)
            return r.tokens, r.seconds, len(r.tokens) / max(r.target_evals, 1)
        if method == "specbound on llama.cpp":
            r = speculative_decode(lc_target, lc_draft, ids, args.tokens, gamma="auto", temperature=0.0)
            return r.tokens, r.metrics.total_time, r.metrics.tau
        if method == "torch plain":
            r = autoregressive_decode(torch_target, ids, args.tokens, temperature=0.0)
            return r.tokens, r.metrics.total_time, 1.0
        if method == "specbound on torch":
            r = speculative_decode(torch_target, torch_draft, ids, args.tokens, gamma="auto", temperature=0.0)
            return r.tokens, r.metrics.total_time, r.metrics.tau
        raise ValueError(method)

    methods = ["llama.cpp plain", "llama.cpp prompt-lookup", "llama.cpp + draft (hook)", "specbound on llama.cpp",
               "torch plain", "specbound on torch"]
    warm = torch_target.tokenizer("def f(x):\n", return_tensors="pt").input_ids[0].tolist()
    for m in methods:
        run(m, warm)
    rows = []
    for i, prompt in enumerate(prompts):
        ids = torch_target.tokenizer(format_prompt(torch_target.tokenizer, prompt), return_tensors="pt").input_ids[0].tolist()
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        res = {}
        for m in order:
            tokens, seconds, tau = run(m, ids)
            res[m] = {"tokens": tokens, "tokens_per_second": len(tokens) / seconds, "tau": tau}
            print(f"{prompt.id} {m:28s} {len(tokens) / seconds:6.2f} tok/s  tau {tau:.2f}", flush=True)
        for m in methods:
            engine_ref = "llama.cpp plain" if "llama" in m else "torch plain"
            res[m]["identical_to_engine_greedy"] = res[m]["tokens"][:args.tokens] == res[engine_ref]["tokens"][:args.tokens]
            res[m]["ratio_to_llamacpp_plain"] = res[m]["tokens_per_second"] / res["llama.cpp plain"]["tokens_per_second"]
        for m in methods:
            del res[m]["tokens"]
        rows.append({"prompt": prompt.id, "order": order, "runs": res})
    lines = [f"# Engines side by side: {args.prompt_set} prompts {args.offset}–{args.offset + len(prompts) - 1}, "
             f"{args.tokens} tokens, greedy, {args.threads} threads", "",
             "Command: `python benchmarks/engines.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`", "",
             "| method | median tok/s | median × llama.cpp plain | median τ | greedy = its engine's greedy |",
             "|---|---:|---:|---:|---:|"]
    for m in methods:
        tps = [r["runs"][m]["tokens_per_second"] for r in rows]
        ratio = [r["runs"][m]["ratio_to_llamacpp_plain"] for r in rows]
        tau = [r["runs"][m]["tau"] for r in rows]
        same = sum(r["runs"][m]["identical_to_engine_greedy"] for r in rows)
        lines.append(f"| {m} | {statistics.median(tps):.2f} | {statistics.median(ratio):.2f}× | "
                     f"{statistics.median(tau):.2f} | {same}/{len(rows)} |")
    text = "\n".join(lines) + "\n"
    (out / "engines.json").write_text(json.dumps({"rows": rows, "args": vars(args),
                                                  "when": time.strftime("%Y-%m-%d %H:%M")}, indent=1))
    (out / "engines.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
