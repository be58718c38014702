"""What does drafting a tree cost, per round, next to drafting a chain of the same depth? (issue: drafting)

Runs speculative decoding through the engine (greedy, EOS ignored, held-out HumanEval prompts) with the
int8 draft and fixed drafting settings — chain γ = 4 and 8, dynamic tree P = 16 and 64 — and reports per
round: draft seconds, draft forwards, drafted nodes, tree depth, accepted tokens, and target seconds.
The level-batched tree drafter reads all frontier nodes of one depth in one draft forward, so a tree of
depth d should cost about d draft forwards (+1 for the root), i.e. about a chain of the same depth.

    .venv/bin/python benchmarks/draft_cost.py [--n-prompts 2] [--tokens 64] [--out runs/draft-cost]

Prints a markdown table and writes <out>/draft-cost.json and <out>/draft-cost.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

SETTINGS = (("chain γ=4", {"gamma": 4}), ("chain γ=8", {"gamma": 8}),
            ("tree P=16", {"tree": 16}), ("tree P=64", {"tree": 64}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--offset", type=int, default=10)
    parser.add_argument("--n-prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="runs/draft-cost")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from specbound.runtime import configure_process
    configure_process()
    from specbound.assets.prompts import format_prompt, load_prompts
    from specbound.decoding import speculative_decode
    from specbound.models.loading import load_pair
    from specbound.runtime import configure_threads

    configure_threads(0)
    prompts = load_prompts("humaneval", limit=args.n_prompts, offset=args.offset)
    target, draft = load_pair(progress=False, draft_int8=True)
    warm = target.tokenizer("def f(x):\n", return_tensors="pt").input_ids
    for _, kwargs in SETTINGS:
        speculative_decode(target, draft, warm, 4, temperature=0.0, **kwargs)
    rows = {name: [] for name, _ in SETTINGS}
    for i, prompt in enumerate(prompts):
        ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids
        order = SETTINGS[i % len(SETTINGS):] + SETTINGS[:i % len(SETTINGS)]
        for name, kwargs in order:
            m = speculative_decode(target, draft, ids, args.tokens, temperature=0.0, **kwargs).metrics
            rounds = len(m.drafted_per_step)
            rows[name].append({"prompt": prompt.id, "rounds": rounds,
                               "draft_seconds_per_round": m.draft_time / rounds,
                               "target_seconds_per_round": m.target_time / rounds,
                               "draft_forwards_per_round": m.draft_calls / rounds,
                               "nodes_per_round": sum(m.drafted_per_step) / rounds,
                               "depth_per_round": sum(m.depth_per_step) / rounds,
                               "tau": m.tau, "decode_tokens_per_second": m.decode_tokens_per_second})
    lines = ["# Draft cost per round: chain vs level-batched dynamic tree", "",
             f"`{' '.join([Path(sys.argv[0]).name] + sys.argv[1:])}` — int8 draft Qwen2.5-Coder-0.5B, fp32 target "
             f"1.5B (oneDNN-prepacked), greedy, {args.tokens} tokens, prompts "
             + ", ".join(p.id for p in prompts) + "; medians over prompts.", "",
             "| setting | nodes/round | depth/round | draft forwards/round | draft s/round | draft s per depth | "
             "target s/round | τ | decode tok/s |", "|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for name, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "prompt"}
        summary[name] = med
        lines.append(f"| {name} | {med['nodes_per_round']:.1f} | {med['depth_per_round']:.2f} | "
                     f"{med['draft_forwards_per_round']:.2f} | {med['draft_seconds_per_round']:.3f} | "
                     f"{med['draft_seconds_per_round'] / max(med['depth_per_round'], 1e-9):.3f} | "
                     f"{med['target_seconds_per_round']:.3f} | {med['tau']:.2f} | {med['decode_tokens_per_second']:.2f} |")
    text = "\n".join(lines) + "\n"
    (out / "draft-cost.md").write_text(text)
    (out / "draft-cost.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
