"""The packaged pair's greedy acceptance per draft depth, on development slices of the prompt sets (never
the slices `specbound bench` and the README's table use: those start at offset 10): what the default
target choice (specbound.measure.deployment.DEFAULT_ACCEPTANCE) prices a pair with before it has shown
its own. Target: the GGUF's own K-quant weights; draft: the 0.5B re-quantised to q4_0 on llama.cpp;
fixed chains of γ = 4 (every depth tested as often as the chain reaches it), 96 new tokens, EOS ends.

    python benchmarks/pair_acceptance.py --out docs/results/pair-acceptance
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from specbound.assets.prompts import format_prompt, load_prompts
from specbound.decoding import speculative_decode
from specbound.models.loading import load_pair
from specbound.models.tokens import stop_token_ids
from specbound.runtime import configure_threads

SLICES = (("humaneval", 0, 10), ("gsm8k", 0, 10), ("mtbench", 0, 10))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default="docs/results/pair-acceptance")
    args = ap.parse_args(argv)
    configure_threads(0)
    target, draft = load_pair(target_precision="kquant", draft_engine="llamacpp", draft_quant="q4_0", compiled=True,
                              progress=False)
    stops = stop_token_ids(target)
    report = {"date": time.strftime("%Y-%m-%d"), "gamma": args.gamma, "target": target.info.kernels,
              "draft": draft.info.kernels, "sets": {}}
    for name, offset, n in SLICES:
        reached, accepted = np.zeros(args.gamma), np.zeros(args.gamma)
        for prompt in load_prompts(name, limit=n, offset=offset):
            ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids
            m = speculative_decode(target, draft, ids, args.max_new_tokens, gamma=args.gamma, temperature=0.0,
                                   stop_token_ids=stops).metrics
            reached[:len(m.position_reached)] += m.position_reached[:args.gamma]
            accepted[:len(m.position_accepted)] += m.position_accepted[:args.gamma]
        report["sets"][f"{name} {offset}-{offset + n - 1}"] = {
            "per_depth": (accepted / np.maximum(reached, 1)).tolist(), "pooled": float(accepted.sum() / reached.sum()),
            "tested": reached.tolist()}
        print(name, json.dumps(report["sets"][f"{name} {offset}-{offset + n - 1}"]), file=sys.stderr)
    lines = [f"# Greedy acceptance of the packaged pair ({report['date']})", "",
             f"`python benchmarks/pair_acceptance.py` — chains of γ = {args.gamma}, {args.max_new_tokens} new tokens; "
             f"target {report['target']}; draft {report['draft']}.", "",
             "| prompts | α per depth 1..γ | pooled α | drafted tokens tested |", "|---|---|---:|---:|"]
    for key, v in report["sets"].items():
        lines.append(f"| {key} | {', '.join(f'{a:.2f}' for a in v['per_depth'])} | {v['pooled']:.3f} | "
                     f"{int(sum(v['tested']))} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pair-acceptance.md").write_text("\n".join(lines) + "\n")
    (out / "pair-acceptance.json").write_text(json.dumps(report, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
